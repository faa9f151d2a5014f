import Foundation
import SyncStore
import Testing

/// What an app gets from `import SyncStore` alone (this file imports
/// nothing else of the package).
@Suite struct UmbrellaTests {
    /// The errors the store's calls throw can be named and matched: a
    /// second open of the same store is refused with `LMDBError`.
    @Test func theStoresLMDBErrorIsNamedWithoutImportingLMDB() throws {
        let directory = NSTemporaryDirectory() + "umbrella-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try Store(path: directory)
        defer { store.close() }
        #expect { try Store(path: directory) } throws: { ($0 as? LMDBError)?.code == .alreadyOpen }
    }
}
