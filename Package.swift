// swift-tools-version: 6.1
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
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CLMDB",
            pkgConfig: "lmdb",
            providers: [.apt(["liblmdb-dev"]), .brew(["lmdb"])]
        ),
        .target(name: "CCRC32C"),
        .target(name: "LogFormat", dependencies: ["CCRC32C"]),
        .target(name: "LMDB", dependencies: ["CLMDB"]),
        .target(name: "LogStore", dependencies: ["LogFormat", "LMDB"]),
        .target(name: "SyncStore", dependencies: ["LogFormat", "LogStore"]),
        .target(name: "LogTesting", dependencies: ["LogFormat", "LogStore"]),

        .executableTarget(
            name: "bench",
            dependencies: [
                "LogFormat", "LogStore", "CLMDB",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tools/bench"
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
        .testTarget(name: "LogStoreTests", dependencies: ["LogStore", "LMDB", "LogTesting"]),
    ],
    swiftLanguageModes: [.v6]
)
