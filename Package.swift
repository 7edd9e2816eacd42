// swift-tools-version:6.0
// The Swift package of CC App Server (docs/swift.md). Hand-written; what it builds is generated:
// CcAppServerProtocol by `cc-agent-protocol generate`, CcAppServerNative and the FFI header by
// scripts/swift-glue.sh.
//
//   .package(url: "https://github.com/chainlesschain/cc-app-server", from: "0.1.0")
//   .product(name: "CcAppServer", package: "cc-app-server")
//
// On Apple platforms the native library is CcAppServerFFI.xcframework (iOS device, iOS simulator,
// macOS), built on macOS by .github/scripts/build-xcframework.sh. On Linux it is the cdylib cargo
// builds: pass `-Xlinker -L<dir of libcc_app_server_ffi.so>` (and an rpath, or LD_LIBRARY_PATH).
import PackageDescription

#if os(Linux)
let nativeLibrary: Target = .systemLibrary(name: "CcAppServerFFI", path: "swift/Sources/CcAppServerFFI")
#else
let nativeLibrary: Target = .binaryTarget(name: "CcAppServerFFI", path: "swift/CcAppServerFFI.xcframework")
#endif

let package = Package(
    name: "CcAppServer",
    platforms: [.macOS(.v12), .iOS(.v15)],
    products: [
        .library(name: "CcAppServer", targets: ["CcAppServer"]),
        .library(name: "CcAppServerProtocol", targets: ["CcAppServerProtocol"]),
    ],
    targets: [
        .target(name: "CcAppServerProtocol", path: "bindings/swift/Sources/CcAppServerProtocol"),
        nativeLibrary,
        .target(
            name: "CcAppServerNative",
            dependencies: ["CcAppServerFFI"],
            path: "swift/Sources/CcAppServerNative",
            // The uniffi glue predates Swift 6's checks; the SDK above it is the Swift 6 surface.
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "CcAppServer",
            dependencies: ["CcAppServerProtocol", "CcAppServerNative"],
            path: "swift/Sources/CcAppServer"
        ),
        .testTarget(
            name: "CcAppServerTests",
            dependencies: ["CcAppServer"],
            path: "swift/Tests/CcAppServerTests"
        ),
        .testTarget(
            name: "ProtocolReplayTests",
            dependencies: ["CcAppServerProtocol"],
            path: "swift/Tests/ProtocolReplayTests"
        ),
        .executableTarget(
            name: "Quickstart",
            dependencies: ["CcAppServer"],
            path: "examples/swift/Quickstart"
        ),
        .executableTarget(
            name: "SwiftBench",
            dependencies: ["CcAppServer"],
            path: "benches/swift/SwiftBench"
        ),
    ]
)
