// The library's diagnostics (and the SDK's own: why an approval was declined, a listener that
// failed) as one stream of `LogRecord`s. On Apple platforms they go to `os.Logger` (subsystem
// "com.chainlesschain.appserver", category = the record's target) unless the host sets a
// handler; on Linux they go to the handler the host sets, and nowhere until it does.
import Foundation
internal import CcAppServerNative
#if canImport(os)
import os
#endif

/// How severe a record is.
public enum LogLevel: Int, Comparable, Hashable, Sendable, CaseIterable {
    case trace, debug, info, warn, error

    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }

    var native: CcAppServerNative.LogLevel {
        switch self {
        case .trace: return .trace
        case .debug: return .debug
        case .info: return .info
        case .warn: return .warn
        case .error: return .error
        }
    }

    init(_ n: CcAppServerNative.LogLevel) {
        switch n {
        case .trace: self = .trace
        case .debug: self = .debug
        case .info: self = .info
        case .warn: self = .warn
        case .error: self = .error
        }
    }
}

/// One diagnostic record.
public struct LogRecord: Hashable, Sendable {
    public var level: LogLevel
    /// Where it comes from: `cc_app_server::…` for the library, `cc_app_server::swift` for the SDK.
    public var target: String
    public var message: String
    /// When it was logged.
    public var date: Date

    public init(level: LogLevel, target: String, message: String, date: Date = Date()) {
        self.level = level
        self.target = target
        self.message = message
        self.date = date
    }
}

/// Receives log records, on a delivery thread (never the caller's): keep it quick.
public typealias LogHandler = @Sendable (LogRecord) -> Void

/// Where the library's and the SDK's diagnostics go.
public enum Logging {
    /// Sends every record at `level` and above to `handler` (nil: the platform default, which is
    /// `os.Logger` on Apple platforms and nothing on Linux). Replaces any earlier handler.
    public static func setHandler(_ handler: LogHandler?, level: LogLevel = .info) {
        Log.install(handler, level: level)
    }

    /// Records dropped because the handler fell more than the library's queue behind.
    public static var droppedRecords: Int { Int(droppedLogRecords()) }
}

/// The process-wide sink. The native listener is installed once (at the first server or the
/// first `setHandler`) and reads the current handler under a lock.
enum Log {
    private static let state = Mutex()
    static let target = "cc_app_server::swift"

    final class Mutex: @unchecked Sendable {
        private let lock = NSLock()
        private var handler: LogHandler?
        private var level: LogLevel = .info
        private var installed = false

        func with<T>(_ body: (inout LogHandler?, inout LogLevel, inout Bool) -> T) -> T {
            lock.lock()
            defer { lock.unlock() }
            return body(&handler, &level, &installed)
        }
    }

    final class Listener: CcAppServerNative.LogListener, @unchecked Sendable {
        func onLog(record: CcAppServerNative.LogRecord) throws {
            Log.deliver(LogRecord(
                level: LogLevel(record.level), target: record.target, message: record.message,
                date: Date(timeIntervalSince1970: Double(record.unixMs) / 1000)))
        }
    }

    static func install(_ handler: LogHandler?, level: LogLevel) {
        state.with { h, l, installed in
            h = handler
            l = level
            installed = true
        }
        _ = setLogListener(listener: Listener(), level: level.native)
    }

    /// Called when a server opens: on Apple platforms the records reach `os.Logger` even when the
    /// host never set a handler.
    static func ensureInstalled() {
        let needed = state.with { _, _, installed in !installed }
        #if canImport(os)
        if needed { install(nil, level: .info) }
        #else
        _ = needed
        #endif
    }

    /// A record from the SDK itself, through the same handler.
    static func emit(_ level: LogLevel, _ message: String) {
        let wanted = state.with { _, l, _ in level >= l }
        if wanted { deliver(LogRecord(level: level, target: target, message: message)) }
    }

    static func deliver(_ record: LogRecord) {
        let handler = state.with { h, l, _ in record.level >= l ? h : nil }
        if let handler {
            handler(record)
            return
        }
        #if canImport(os)
        let logger = Logger(subsystem: "com.chainlesschain.appserver", category: record.target)
        switch record.level {
        case .error: logger.error("\(record.message, privacy: .public)")
        case .warn: logger.warning("\(record.message, privacy: .public)")
        case .info: logger.info("\(record.message, privacy: .public)")
        case .debug, .trace: logger.debug("\(record.message, privacy: .public)")
        }
        #endif
    }
}
