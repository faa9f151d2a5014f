import LMDB
import LogFormat
import LogStore
import LogTesting
import Testing

/// A pull cursor damaged on disk, with a real engine, server and store.
@Suite struct DamagedCursorTests {
    /// Bytes in the stored cursor that no cursor has (here one past `~`)
    /// are damage the store names, not a cursor to send: the engine
    /// resyncs with a reason that names it and pulls the feed from the
    /// start, so the replica comes to hold what the server does. They were
    /// read with a replacement character and sent; the server's 410 ended
    /// in a resync whose reason blamed the server, and the damage was
    /// never named.
    @Test func aDamagedCursorIsNamedAndTheReplicaResyncs() async throws {
        let server = try await TestServer("damaged-cursor")
        let a = try Replica("damaged-cursor-a", server: server)
        let b = try Replica("damaged-cursor-b", server: server)
        _ = try await b.store.create(type: "task", fields: Fields([("title", .string("one"))]))
        try await b.syncUntilQuiet()
        try await a.syncUntilQuiet()
        let cursor = try #require(try a.store.pullCursor())
        a.store.close()
        do {
            let environment = try Environment(path: a.directory.path)
            defer { environment.close() }
            let meta = try #require(try environment.openDatabase("meta", create: false))
            try environment.write { txn in try txn.put(meta, key: Array("cursor".utf8), value: Array(cursor.utf8) + [0xFF]) }
        }
        try a.restart()
        let error = #expect(throws: LogStoreError.self) { try a.store.pullCursor() }
        #expect(error?.code == .corruptEntry && error?.detail.contains("key \"cursor\"") == true, "\(String(describing: error))")
        _ = try await b.store.create(type: "task", fields: Fields([("title", .string("two"))]))
        try await b.syncUntilQuiet()
        try await a.syncUntilQuiet()
        #expect(a.resyncs == 1)
        let reasons = try a.entries(.resync).map { entry -> String in
            guard case .resync(let reason) = entry.body else { return "" }
            return reason
        }
        #expect(reasons.count == 1 && reasons.allSatisfy { $0.contains("the stored pull cursor is damaged") }, "\(reasons)")
        #expect(try a.entities("task") == b.entities("task") && a.entities("task").count == 2)
        #expect(try a.store.pullCursor() != nil)
        await server.stop()
    }
}
