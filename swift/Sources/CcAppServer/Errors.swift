// Typed failures of the SDK: every request ends in a result or one `AppServerError`, carrying the
// JSON-RPC code it stands for, so a `catch`, a log line and the Python and Kotlin SDKs all agree.
internal import CcAppServerNative
import CcAppServerProtocol

/// Why a call did not produce a result. Match on the case; `code` is the JSON-RPC code
/// (`-32004` not found, `-32009` conflict, …) and `message` the reason, as on the wire.
public enum AppServerError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Unknown thread, turn or run (`-32004`).
    case notFound(message: String)
    /// The request conflicts with the state (a turn already running, an idempotency key reused
    /// for different params…) (`-32009`).
    case conflict(message: String)
    /// Parameters the schema or the engine refused (`-32602`), locally or by the server.
    case invalidParams(message: String)
    /// Too many requests in flight, or the server's queue is full: wait `retryAfter` seconds and
    /// retry (`-32001`).
    case overloaded(retryAfter: Double)
    /// No answer within the request timeout (`-32010`). Never read this as success: the request
    /// may still have taken effect.
    case timeout
    /// The client or the server is closed; open a new one to go on.
    case closed(message: String)
    /// The rollout store could not be opened or written (I/O, SQLite) for a reason other than
    /// the three below. `isStoreError` is true for all four.
    case store(message: String)
    /// Another server, in this process or another, holds the state directory: close it first.
    case storeLocked(message: String)
    /// The state directory is not a private directory (a regular file, a symlink, group or world
    /// access): the message says how to fix it.
    case storeUnsafe(message: String)
    /// A rollout log is corrupt or does not match its head anchor: restore it from a backup (the
    /// log was not modified).
    case storeDamaged(message: String)
    /// A turn ended `failed` (from `TurnEvents.text()`): `reason` is the turn error's code
    /// (`kernelFailed`, `kernelPanicked`, `recordingFailed`, `outputLimit`, …).
    case kernelFailed(reason: String, message: String, turnId: String)
    /// A turn ended `interrupted` (from `TurnEvents.text()`).
    case turnInterrupted(turnId: String)
    /// The request is larger than the server's line limit; nothing was sent (`-32600`).
    case lineTooLarge(size: Int, max: Int)
    /// A result or notification the generated types refused: the server broke the protocol
    /// (`-32700`). `pointer` says where.
    case invalidJSON(message: String)
    /// Any other JSON-RPC error the server answered with; `data` is its `data`, if any.
    case server(code: Int, message: String, data: JSONValue?)

    /// The JSON-RPC code this error stands for.
    public var code: Int {
        switch self {
        case .notFound: return ErrorCode.notFound
        case .conflict: return ErrorCode.conflict
        case .invalidParams: return ErrorCode.invalidParams
        case .overloaded: return ErrorCode.overloaded
        case .timeout: return ErrorCode.interrupted
        case .closed, .store, .storeLocked, .storeUnsafe, .storeDamaged, .kernelFailed: return ErrorCode.internal
        case .turnInterrupted: return ErrorCode.interrupted
        case .lineTooLarge: return ErrorCode.invalidRequest
        case .invalidJSON: return ErrorCode.parse
        case .server(let code, _, _): return code
        }
    }

    /// The reason, as the server or the SDK gave it.
    public var message: String {
        switch self {
        case .notFound(let m), .conflict(let m), .invalidParams(let m), .closed(let m),
             .store(let m), .storeLocked(let m), .storeUnsafe(let m), .storeDamaged(let m),
             .invalidJSON(let m):
            return m
        case .kernelFailed(let reason, let m, let turn): return "turn \(turn) failed (\(reason)): \(m)"
        case .turnInterrupted(let turn): return "turn \(turn) was interrupted"
        case .overloaded(let s): return "overloaded; retry after \(s) s"
        case .timeout: return "no answer within the request timeout"
        case .lineTooLarge(let size, let max): return "request of \(size) bytes exceeds the \(max)-byte limit"
        case .server(_, let m, _): return m
        }
    }

    public var description: String { "AppServerError(\(code)): \(message)" }

    /// True for every failure of the rollout store: `.store`, `.storeLocked`, `.storeUnsafe`,
    /// `.storeDamaged`.
    public var isStoreError: Bool {
        switch self {
        case .store, .storeLocked, .storeUnsafe, .storeDamaged: return true
        default: return false
        }
    }
}

// The wire's error codes are the generated `ErrorCode` (CcAppServerProtocol, re-exported):
// `ErrorCode.notFound`, `ErrorCode.internal`, … — one per error class of the schema.

extension AppServerError {
    /// A JSON-RPC error answer as the case a caller matches on.
    static func fromServer(code: Int, message: String, data: String?) -> AppServerError {
        switch code {
        case ErrorCode.notFound: return .notFound(message: message)
        case ErrorCode.conflict: return .conflict(message: message)
        case ErrorCode.invalidParams: return .invalidParams(message: message)
        case ErrorCode.overloaded:
            // The server's -32001 carries `data.retryAfterMs`.
            var seconds = 0.0
            if let data, case .object(let o)? = try? JSONValue.parse(data),
               case .number(let n)? = o["retryAfterMs"], let ms = Double(n) {
                seconds = ms / 1000
            }
            return .overloaded(retryAfter: seconds)
        default:
            return .server(code: code, message: message, data: data.flatMap { try? JSONValue.parse($0) })
        }
    }

    /// Any error out of the native layer (or already ours) as an `AppServerError`.
    static func from(_ error: any Error) -> any Error {
        switch error {
        case let e as AppServerError: return e
        case let e as ClientError:
            switch e {
            case .Overloaded(let ms): return AppServerError.overloaded(retryAfter: Double(ms) / 1000)
            case .Timeout: return AppServerError.timeout
            case .Closed: return AppServerError.closed(message: "the client is closed")
            case .LineTooLarge(let size, let max): return AppServerError.lineTooLarge(size: Int(size), max: Int(max))
            case .Protocol(let code, let reason, let data):
                return fromServer(code: Int(code), message: reason, data: data)
            case .InvalidJson(let reason): return AppServerError.invalidParams(message: "invalid JSON: \(reason)")
            case .InvalidArgument(let reason): return AppServerError.invalidParams(message: reason)
            }
        case let e as ServerError:
            switch e {
            case .InvalidConfig(let reason): return AppServerError.invalidParams(message: reason)
            case .Store(let kind, let reason):
                switch kind {
                case .locked: return AppServerError.storeLocked(message: reason)
                case .unsafe: return AppServerError.storeUnsafe(message: reason)
                case .damaged: return AppServerError.storeDamaged(message: reason)
                case .io: return AppServerError.store(message: reason)
                }
            case .ShutDown: return AppServerError.closed(message: "the server is shut down; open a new one")
            case .Overloaded(let ms): return AppServerError.overloaded(retryAfter: Double(ms) / 1000)
            }
        case let e as ProtocolDecodeError:
            return AppServerError.invalidJSON(message: e.description)
        default:
            return error
        }
    }
}

/// Runs a native call, turning the glue's errors into the SDK's.
@inline(__always)
func mapNative<T>(_ body: () throws -> T) throws -> T {
    do { return try body() } catch { throw AppServerError.from(error) }
}

/// A result the generated types refuse is the server breaking the protocol, not the caller's bug.
func decoding<T>(_ what: String, _ body: () throws -> T) throws -> T {
    do { return try body() } catch let e as ProtocolDecodeError {
        throw AppServerError.invalidJSON(message: "\(what): \(e.description)")
    }
}

/// Names a host error for a log line or a kernel/tool failure, without a stack trace.
func describe(_ error: any Error) -> String {
    let text = String(describing: error)
    let type = String(describing: Swift.type(of: error))
    return text.hasPrefix(type) ? text : "\(type): \(text)"
}
