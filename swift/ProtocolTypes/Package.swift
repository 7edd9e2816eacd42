// swift-tools-version:5.9
// Replay harness for the generated Swift protocol types (bindings/swift, module CcAppServerProtocol).
// Hand-written; runs on macOS in .github/workflows/swift-protocol.yml.
import PackageDescription

let package = Package(
    name: "ProtocolTypes",
    platforms: [.macOS(.v12)],
    dependencies: [
        // A local package's identity is its directory name: "swift".
        .package(path: "../../bindings/swift"),
    ],
    targets: [
        .testTarget(
            name: "ProtocolReplayTests",
            dependencies: [.product(name: "CcAppServerProtocol", package: "swift")],
            path: "Tests/ProtocolReplayTests"
        ),
    ]
)
