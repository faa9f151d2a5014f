// swift-tools-version: 6.2
import PackageDescription

// Module layout and import rules are in ../shared/STYLE.md ("Module layout"):
// a module imports only modules above it in this list.
let package = Package(
    name: "SyncStore",
    platforms: [.macOS(.v15), .iOS(.v18)],
    products: [
        .library(name: "SyncStore", targets: ["SyncStore"]),
        .executable(name: "bench", targets: ["bench"]),
        .executable(name: "demo", targets: ["demo"]),
        .executable(name: "syncserver", targets: ["syncserver"]),
        .executable(name: "logtool", targets: ["logtool"]),
        .executable(name: "crashtest", targets: ["crashtest"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        // Both already come with Hummingbird; named for the server's parser-error handler.
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
        // Also comes with Hummingbird; named for SyncServer.serve()'s graceful stop.
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CLMDB",
            pkgConfig: "lmdb",
            providers: [.apt(["liblmdb-dev"]), .brew(["lmdb"])]
        ),
        .target(name: "CCRC32C"),
        .systemLibrary(name: "CZlib", providers: [.apt(["zlib1g-dev"]), .brew(["zlib"])]),
        // posix_spawn for LogTesting's ChildProcess (see cspawn.h).
        .target(name: "CSpawn"),
        .target(name: "LogFormat", dependencies: ["CCRC32C", "CZlib"]),
        .target(name: "LMDB", dependencies: ["CLMDB"]),
        .target(name: "LogStore", dependencies: ["LogFormat", "LMDB"]),
        .target(
            name: "LogServer",
            dependencies: [
                "LogFormat", "LMDB",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .target(name: "LogSync", dependencies: ["LogFormat", "LogStore"]),
        .target(name: "LogSyncHTTP", dependencies: ["LogFormat", "LogSync"]),
        .target(name: "SyncStore", dependencies: ["LMDB", "LogFormat", "LogStore", "LogSync", "LogSyncHTTP"]),
        .target(name: "LogTesting", dependencies: ["CSpawn", "LogFormat", "LMDB", "LogStore", "LogSync", "LogServer"]),

        .executableTarget(
            name: "bench",
            dependencies: [
                "LMDB", "LogFormat", "LogStore", "LogServer", "LogSync", "LogSyncHTTP", "CLMDB",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tools/bench"
        ),
        .target(
            name: "ToolSupport",
            dependencies: [.product(name: "ArgumentParser", package: "swift-argument-parser")],
            path: "Tools/ToolSupport"
        ),
        .executableTarget(
            name: "logtool",
            dependencies: [
                "LogFormat", "LogStore", "ToolSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tools/logtool"
        ),
        .executableTarget(
            name: "syncserver",
            dependencies: [
                "LMDB", "LogServer", "ToolSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Hummingbird", package: "hummingbird"),
            ],
            path: "Tools/syncserver"
        ),
        .executableTarget(
            name: "crashtest",
            dependencies: [
                "LogFormat", "LMDB", "LogStore", "LogSync", "LogSyncHTTP", "LogTesting",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tools/crashtest"
        ),
        .executableTarget(
            name: "demo",
            dependencies: [
                "SyncStore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tools/demo"
        ),

        .testTarget(name: "LogFormatTests", dependencies: ["LogFormat", "LogTesting"]),
        .testTarget(name: "LMDBTests", dependencies: ["LMDB", "LogTesting"]),
        .testTarget(name: "LogStoreTests", dependencies: ["LogStore", "LMDB", "LogTesting", "SyncStore"]),
        .testTarget(
            name: "LogServerTests",
            dependencies: ["LogServer", "LogFormat", "LMDB", "LogTesting"]),
        .testTarget(
            name: "LogSyncTests",
            dependencies: ["LogSync", "LogSyncHTTP", "LogStore", "LogServer", "LogFormat", "LMDB", "LogTesting"]),
        .testTarget(name: "LogToolTests", dependencies: ["LogStore", "LogFormat", "LMDB", "LogTesting"]),
        .testTarget(name: "CrashTests", dependencies: ["LMDB", "LogTesting"]),
    ],
    swiftLanguageModes: [.v6]
)
