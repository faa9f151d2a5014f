import Foundation
import GRDB

/// The SQLite baseline: the outbox table an iOS sync engine keeps (see the
/// seeds), one row per transaction, through GRDB's `DatabaseQueue` in WAL
/// mode with `synchronous=FULL`, which syncs the WAL on every commit.
final class SQLiteOutbox {
    private let queue: DatabaseQueue
    static let insertSQL = """
        INSERT INTO outbox (idempotency_key, entity_type, entity_id, payload, created_at) VALUES (?, ?, ?, ?, ?)
        """

    /// The settings SQLite reports it is running with, checked at open.
    struct Settings: Codable, Sendable {
        var journalMode: String
        var synchronous: Int
        var sqliteVersion: String
    }

    let settings: Settings

    init(path: String) throws {
        let opened = try SQLiteOutbox.openDurable(
            path: path,
            schema: [
                """
                CREATE TABLE outbox (
                    id INTEGER PRIMARY KEY,
                    idempotency_key TEXT NOT NULL,
                    entity_type TEXT NOT NULL,
                    entity_id TEXT NOT NULL,
                    payload BLOB NOT NULL,
                    created_at INTEGER NOT NULL)
                """
            ])
        queue = opened.queue
        settings = opened.settings
    }

    /// Opens `path` with a `DatabaseQueue` in WAL mode with
    /// `synchronous=FULL`, creates the tables of `schema`, and checks that
    /// SQLite reports both settings. Every SQLite baseline opens this way.
    static func openDurable(path: String, schema: [String]) throws -> (queue: DatabaseQueue, settings: Settings) {
        var configuration = Configuration()
        configuration.journalMode = .wal
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        // GRDB sets synchronous=NORMAL when it enables WAL, after any
        // prepareDatabase hook, so FULL is set on the open connection (a
        // DatabaseQueue has only the one).
        try queue.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
        try queue.write { db in
            for statement in schema { try db.execute(sql: statement) }
        }
        let settings = try queue.read { db in
            Settings(
                journalMode: try String.fetchOne(db, sql: "PRAGMA journal_mode") ?? "?",
                synchronous: try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1,
                sqliteVersion: try String.fetchOne(db, sql: "SELECT sqlite_version()") ?? "?")
        }
        // 2 is FULL. Anything else would make the comparison meaningless.
        guard settings.journalMode == "wal", settings.synchronous == 2 else {
            throw BenchError("SQLite runs with journal_mode=\(settings.journalMode), synchronous=\(settings.synchronous)")
        }
        return (queue, settings)
    }

    /// Inserts one outbox row in a transaction of its own; returns after
    /// the commit.
    func insert(idempotencyKey: String, entityType: String, entityID: String, payload: Data, createdAt: Int64) throws {
        try queue.write { db in
            let statement = try db.cachedStatement(sql: SQLiteOutbox.insertSQL)
            try statement.execute(arguments: [idempotencyKey, entityType, entityID, payload, createdAt])
        }
    }

    func rowCount() throws -> Int {
        try queue.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM outbox") ?? 0 }
    }

    func close() throws { try queue.close() }
}

/// An error of the bench itself, with what went wrong.
struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
