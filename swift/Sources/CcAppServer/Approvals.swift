// Approvals: the host's async handler behind the native, synchronous `ApprovalHandler`. The
// decision is the only way a tool runs under `.askEveryTime`, so every failure path declines.
import Foundation
internal import CcAppServerNative
import CcAppServerProtocol

/// The params of one `approval/decide` request: the operation, why, and the binding (thread, turn,
/// item, operation/policy/workspace digests, nonce, expiry) the decision is bound to.
public typealias ApprovalDecideParams = CcAppServerProtocol.ApprovalRequest

/// The host's answer to an approval request.
public enum Decision: Hashable, Sendable {
    /// Run this one call.
    case acceptOnce
    /// Run it, and the same operation again for the rest of this turn.
    case acceptForTurn
    /// Run it, and the same operation again on this connection while policy and workspace hold.
    case acceptForSession
    /// Do not run it; the turn goes on (the model sees the reason).
    case decline(reason: String?)
    /// Do not run it and interrupt the turn.
    case cancel

    var native: CcAppServerNative.ApprovalDecision {
        switch self {
        case .acceptOnce: return .acceptOnce
        case .acceptForTurn: return .acceptForTurn
        case .acceptForSession: return .acceptForSession
        case .decline(let reason): return .decline(reason: reason)
        case .cancel: return .cancel
        }
    }
}

/// Decides approvals. Called once per `approval/decide`; throwing (or not answering within the
/// approval timeout) declines, and the log says why.
public typealias ApprovalHandler = @Sendable (ApprovalDecideParams) async throws -> Decision

/// A one-shot slot a native thread waits on while the Swift handler runs in a task.
private final class DecisionSlot: @unchecked Sendable {
    private let lock = NSLock()
    private let done = DispatchSemaphore(value: 0)
    private var value: Result<Decision, any Error>?

    func fill(_ v: Result<Decision, any Error>) {
        lock.lock()
        let first = value == nil
        if first { value = v }
        lock.unlock()
        if first { done.signal() }
    }

    func wait(seconds: Double) -> Result<Decision, any Error>? {
        guard done.wait(timeout: .now() + seconds) == .success else { return nil }
        lock.lock()
        defer { lock.unlock() }
        return value
    }
}

/// The bridge the native client calls on its approval thread. It blocks that (Rust-owned) thread,
/// never a Swift concurrency thread, while the handler runs as a task.
final class ApprovalBridge: CcAppServerNative.ApprovalHandler, @unchecked Sendable {
    private let handler: ApprovalHandler
    private let timeout: Double

    init(_ handler: @escaping ApprovalHandler, timeout: Double) {
        self.handler = handler
        self.timeout = timeout
    }

    func decide(request: CcAppServerNative.ApprovalRequest) throws -> CcAppServerNative.ApprovalDecision {
        let params: ApprovalDecideParams
        do {
            params = try ApprovalDecideParams(json: JSONValue.parse(request.paramsJson), mode: .receive)
        } catch {
            Log.emit(.warn, "approval request \(request.binding.itemId) did not decode, declining: \(describe(error))")
            throw HandlerError.Failed(reason: "the approval request did not decode: \(describe(error))")
        }
        let slot = DecisionSlot()
        let handler = self.handler
        let task = Task {
            do { slot.fill(.success(try await handler(params))) } catch { slot.fill(.failure(error)) }
        }
        guard let result = slot.wait(seconds: timeout) else {
            task.cancel()
            Log.emit(.warn, "approval handler did not answer \(params.binding.itemId) within \(timeout) s, declining")
            throw HandlerError.Failed(reason: "the approval handler did not answer in time")
        }
        switch result {
        case .success(let decision):
            return decision.native
        case .failure(let error):
            Log.emit(.warn, "approval handler threw for \(params.binding.itemId), declining: \(describe(error))")
            throw HandlerError.Failed(reason: describe(error))
        }
    }
}
