import Foundation
import LogStore
import LogTesting
import Testing

/// Entity ids are compared by their bytes (`Format/storage.md`, section 1):
/// "café" spelled with U+00E9 and spelled with U+0065 U+0301 are two
/// entities, which Swift's `String` equality (canonical equivalence) takes
/// for one.
@Suite struct LogToolEntityNameTests {
    static let precomposed = "caf\u{E9}"
    static let decomposed = "cafe\u{301}"

    /// A new store at `path` with one entity of type `te` for each id.
    private func makeStore(_ path: String, ids: [String]) async throws {
        let store = try Store(path: path, options: .init(durability: .process))
        for (index, id) in ids.enumerated() { try await store.create(type: "te", id: id, fields: ["n": .int(Int64(index))]) }
        store.close()
    }

    @Test func diffTellsCanonicallyEquivalentIDsApart() async throws {
        let directory = try TemporaryDirectory("logtool-diff-ids")
        let (first, second) = (directory.appending("first"), directory.appending("second"))
        try await makeStore(first, ids: [Self.precomposed])
        try await makeStore(second, ids: [Self.decomposed])
        let diff = try await Tool.run(["diff", first, second, "--json"])
        #expect(diff.status == 1, "\(diff.errors)")
        #expect(try diff.objects().compactMap { $0["difference"] as? String } == ["only in \(second)", "only in \(first)"])
        // One store with both: two entities, not one.
        let both = directory.appending("both")
        try await makeStore(both, ids: [Self.precomposed, Self.decomposed])
        let same = try await Tool.run(["diff", both, first])
        #expect(same.status == 1 && same.errors.contains("2 and 1 entities, 1 differ"), "\(same.errors)")
    }

    @Test func dumpByIDMatchesTheIDsBytes() async throws {
        let directory = try TemporaryDirectory("logtool-dump-id")
        try await makeStore(directory.path, ids: [Self.precomposed, Self.decomposed])
        for (id, offset) in [(Self.precomposed, 1), (Self.decomposed, 2)] {
            let dump = try await Tool.run(["dump", directory.path, "--id", id, "--json"])
            #expect(dump.status == 0, "\(dump.errors)")
            #expect(try dump.objects().compactMap { $0["offset"] as? Int } == [offset])
        }
    }

    /// The bundle holds no unrelated data: an entity the tail does not
    /// touch stays out, even when its id looks like a touched one's.
    @Test func aBundleLeavesOutAnEntityWhoseIDOnlyLooksTouched() async throws {
        let directory = try TemporaryDirectory("logtool-bundle-ids")
        let source = directory.appending("store")
        try await makeStore(source, ids: [Self.decomposed, Self.precomposed])
        let bundle = directory.appending("bundle")
        let run = try await Tool.run(["bundle", source, "--tail", "1", "-o", bundle])
        #expect(run.status == 0, "\(run.errors)")
        let entities = try await Tool.run(["entities", bundle, "te", "--json"]).objects()
        #expect(entities.count == 1 && (entities.first?["fields"] as? [String: Any])?["n"] as? Int == 1, "\(entities)")
        #expect(try await Tool.run(["dump", bundle, "--json"]).objects().compactMap { $0["offset"] as? Int } == [2])
    }
}
