// The in-process server: one state directory, opened once, shared by any number of clients.
import Foundation
internal import CcAppServerNative
import CcAppServerProtocol

/// Which set of bounds a server starts from (docs/engine.md, "Small devices"); `limits` set
/// beside it still win.
public enum ServerProfile: Hashable, Sendable {
    /// Sized for a desktop: 256 connections, 1,024 loaded threads, a 32 MiB tail cache (the default).
    case standard
    /// For phones and watches: 8 connections, 4 running turns, 16 loaded threads, a 512 KiB tail cache.
    case compact
}

/// Where a server keeps its rollouts.
public enum StoreKind: Hashable, Sendable {
    /// One JSONL file per thread (the default).
    case jsonl
    /// One SQLite database.
    case sqlite
}

/// When a rollout append counts as done (docs/rollout-format.md).
public enum Durability: Hashable, Sendable {
    /// Group commit with fdatasync before any client sees the event (the default).
    case sync
    /// Written to the OS, fsynced on flush and close: survives a process crash, not a power loss.
    case buffered
    /// In memory until flush and close.
    case ephemeral
}

/// When a tool needs a human decision.
public enum ApprovalPolicy: Hashable, Sendable {
    /// Every tool call asks, unless a grant for the same operation still holds (the default).
    case askEveryTime
    /// Tools run without asking (trusted automation only).
    case autoApprove
    /// No tool ever runs.
    case denyAll
}

/// Bounds; nil keeps the library's default (docs/engine.md, "Default bounds").
public struct Limits: Hashable, Sendable {
    /// Longest message line, in bytes (default 1 MiB).
    public var maxLineBytes: Int?
    /// Messages queued toward the server per connection.
    public var inboundMessages: Int?
    /// Messages queued toward the host per connection.
    public var outboundMessages: Int?
    /// How long an interrupted turn may take to settle, in seconds.
    public var settleDeadline: Double?
    /// How long a full outbound queue may go unread before the connection is dropped, in seconds.
    public var outboundStall: Double?

    public init(maxLineBytes: Int? = nil, inboundMessages: Int? = nil, outboundMessages: Int? = nil,
                settleDeadline: Double? = nil, outboundStall: Double? = nil) {
        self.maxLineBytes = maxLineBytes
        self.inboundMessages = inboundMessages
        self.outboundMessages = outboundMessages
        self.settleDeadline = settleDeadline
        self.outboundStall = outboundStall
    }
}

/// How a server is opened. Every field has the library's default.
public struct ServerOptions: Hashable, Sendable {
    public var store: StoreKind
    public var durability: Durability
    public var policy: ApprovalPolicy
    /// How long the server waits for an approval decision, in seconds (default 30).
    public var approvalTimeout: Double?
    /// What approvals are bound to (the workspace digest), e.g. the workspace root.
    public var workspace: String?
    /// Keyed tamper evidence: exactly 32 bytes from the Keychain. Never written anywhere.
    public var rolloutKey: [UInt8]?
    /// A script for the built-in scripted kernel (JSON text, docs/kernels.md); a thread's
    /// `agentOptions.script` still wins. Unused when a host kernel is given.
    public var scriptJSON: String?
    /// Run approved tools with the workspace tool set confined to this existing directory,
    /// instead of the echo tool.
    public var workspaceToolsDirectory: String?
    /// Open threads whose head anchor is missing or damaged instead of refusing them.
    public var acceptUnanchored: Bool
    public var limits: Limits
    /// The bounds to start from; `.compact` on a phone or a watch.
    public var profile: ServerProfile

    public init(store: StoreKind = .jsonl, durability: Durability = .sync, policy: ApprovalPolicy = .askEveryTime,
                approvalTimeout: Double? = nil, workspace: String? = nil, rolloutKey: [UInt8]? = nil,
                scriptJSON: String? = nil, workspaceToolsDirectory: String? = nil, acceptUnanchored: Bool = false,
                limits: Limits = .init(), profile: ServerProfile = .standard) {
        self.store = store
        self.durability = durability
        self.policy = policy
        self.approvalTimeout = approvalTimeout
        self.workspace = workspace
        self.rolloutKey = rolloutKey
        self.scriptJSON = scriptJSON
        self.workspaceToolsDirectory = workspaceToolsDirectory
        self.acceptUnanchored = acceptUnanchored
        self.limits = limits
        self.profile = profile
    }
}

/// Client-side bounds; nil keeps the default.
public struct ClientOptions: Hashable, Sendable {
    /// A request unanswered this long fails with `.timeout`, in seconds (default 120).
    public var requestTimeout: Double?
    /// Requests in flight at once; one more fails with `.overloaded` (default 256).
    public var maxPending: Int?
    /// How long the approval handler may take before the client declines, in seconds (default 30).
    public var approvalTimeout: Double?
    /// Messages each notification stream buffers before the delivery thread waits for its reader.
    public var streamBuffer: Int

    public init(requestTimeout: Double? = nil, maxPending: Int? = nil, approvalTimeout: Double? = nil,
                streamBuffer: Int = 8192) {
        self.requestTimeout = requestTimeout
        self.maxPending = maxPending
        self.approvalTimeout = approvalTimeout
        self.streamBuffer = streamBuffer
    }
}

func millis(_ seconds: Double?) -> Int64? {
    seconds.map { Int64(($0 * 1000).rounded()) }
}

func int32(_ v: Int?) -> Int32? {
    v.map { Int32(clamping: $0) }
}

extension ServerOptions {
    func native(stateDirectory: String) -> CcAppServerNative.ServerOptions {
        let store: CcAppServerNative.StoreKind = self.store == .jsonl ? .jsonl : .sqlite
        let durability: CcAppServerNative.Durability
        switch self.durability {
        case .sync: durability = .sync
        case .buffered: durability = .buffered
        case .ephemeral: durability = .ephemeral
        }
        return CcAppServerNative.ServerOptions(
            stateDir: stateDirectory, store: store, durability: durability, policy: policy.native,
            workspace: workspace, scriptJson: scriptJSON, approvalTimeoutMs: millis(approvalTimeout),
            settleDeadlineMs: millis(limits.settleDeadline), maxLineBytes: limits.maxLineBytes.map(Int64.init),
            inboundMessages: int32(limits.inboundMessages), outboundMessages: int32(limits.outboundMessages),
            openai: nil, workspaceToolsDir: workspaceToolsDirectory, outboundStallMs: millis(limits.outboundStall),
            rolloutKey: rolloutKey.map { Data($0) }, acceptUnanchored: acceptUnanchored,
            profile: profile == .compact ? .compact : .standard)
    }
}

extension ApprovalPolicy {
    var native: CcAppServerNative.ApprovalPolicy {
        switch self {
        case .askEveryTime: return .askEveryTime
        case .autoApprove: return .autoApprove
        case .denyAll: return .denyAll
        }
    }
}

/// An in-process app server over one state directory. Open it once per directory (the store is
/// locked against a second process), make clients with `client(approvals:)`, `close()` it when done.
public final class AppServer: Sendable {
    let native: CcAppServerNative.AppServer

    private init(_ native: CcAppServerNative.AppServer) {
        self.native = native
    }

    /// Opens (creating the directory 0700 if needed), recovering torn tails and closing turns a
    /// previous process left running. `kernel` replaces the scripted kernel, `tools` the echo tool.
    public static func open(stateDirectory: String, options: ServerOptions = .init(),
                            kernel: (any AgentKernel)? = nil, tools: (any ToolExecutor)? = nil) throws -> AppServer {
        Log.ensureInstalled()
        guard !stateDirectory.isEmpty else {
            throw AppServerError.invalidParams(message: "the state directory must not be empty")
        }
        let nativeKernel = kernel.map { KernelBridge($0) }
        let nativeTools = tools.map { ToolBridge($0) }
        return try mapNative {
            AppServer(try CcAppServerNative.AppServer.open(
                options: options.native(stateDirectory: stateDirectory), kernel: nativeKernel, tools: nativeTools))
        }
    }

    /// A connected, initialized client. `approvals` decides tool approvals; without it every
    /// approval is declined (and the log says so).
    public func client(approvals: ApprovalHandler? = nil, options: ClientOptions = .init()) async throws -> Client {
        try Client(server: self, approvals: approvals, options: options)
    }

    /// Changes the approval policy for what comes next.
    public func setPolicy(_ policy: ApprovalPolicy) {
        native.setPolicy(policy: policy.native)
    }

    /// Tools the server has run since it opened.
    public var toolsExecuted: Int { Int(native.toolsExecuted()) }

    /// Shuts the server down: running turns are interrupted and settled, the store is flushed
    /// and closed, every client is closed. Idempotent.
    public func close() {
        native.shutdown()
    }
}
