import LogFormat

/// Random values and entries for seeded tests: every kind, every value type,
/// nested values and non-ASCII text, within the format's limits.
public struct RandomEntries {
    public var random: SeededRandom

    public init(seed: UInt64) { random = SeededRandom(seed: seed) }

    public mutating func int(_ range: ClosedRange<Int>) -> Int { Int.random(in: range, using: &random) }

    public mutating func string(maxLength: Int = 12) -> String {
        let alphabet = Array("abcXYZ019_-é漢😀 ")
        return String((0..<int(0...maxLength)).map { _ in alphabet[int(0...alphabet.count - 1)] })
    }

    public mutating func value(depth: Int = 0) -> Value {
        let choice = int(0...(depth < 3 ? 9 : 7))
        switch choice {
        case 0: return .null
        case 1: return .bool(int(0...1) == 1)
        case 2: return .int(Int64(bitPattern: random.next()))
        case 3: return .double(Double(bitPattern: random.next()))
        case 4: return .string(string())
        case 5: return .bytes((0..<int(0...16)).map { _ in UInt8.random(in: 0...255, using: &random) })
        case 6: return .timestamp(Int64.random(in: -1 << 50...1 << 52, using: &random))
        case 7: return .int(Int64(int(-1000...1000)))
        case 8: return .array((0..<int(0...3)).map { _ in value(depth: depth + 1) })
        default: return .object(fields(depth: depth + 1))
        }
    }

    public mutating func fields(depth: Int = 0, countMax: Int = 4) -> Fields {
        Fields((0..<int(0...countMax)).map { _ in (string(maxLength: 6), value(depth: depth)) })
    }

    public mutating func body() -> EntryBody {
        let type = ["te", "prj", "ct", "τ"][int(0...3)]
        let id = "\(type)_\(string(maxLength: 8))"
        let version = UInt64(int(0...1_000_000))
        let offset = UInt64(int(1...1_000_000))
        switch int(0...6) {
        case 0:
            let operation = Intent.Operation.allCases[int(0...2)]
            return .intent(
                Intent(
                    operation, idempotencyKey: string(), entityType: type, entityID: id, baseVersion: version,
                    fields: operation == .delete ? [:] : fields()))
        case 1:
            return .ack(Ack(intentOffset: offset, outcome: Ack.Outcome.allCases[int(0...1)], serverVersion: version))
        case 2:
            return .reject(Reject(intentOffset: offset, code: "VALIDATION_ERROR", message: string(maxLength: 40)))
        case 3:
            return .remote(
                Remote(
                    cursor: string(), Remote.Operation.allCases[int(0...1)], entityType: type, entityID: id,
                    serverVersion: version, fields: fields()))
        case 4:
            return .conflict(
                Conflict(
                    intentOffset: offset, entityType: type, entityID: id, serverVersion: version,
                    serverDeleted: int(0...1) == 1, serverFields: fields(),
                    resolution: Conflict.Resolution.allCases[int(0...4)], resolvedFields: fields()))
        case 5:
            return .resync(reason: string(maxLength: 30))
        default:
            return .snapshot(
                Snapshot(
                    watermark: offset, cursor: string(), entityType: type, entityID: id, serverVersion: version,
                    fields: fields()))
        }
    }

    public mutating func entry(offset: UInt64? = nil) -> Entry {
        Entry(
            offset: offset ?? UInt64.random(in: 1...UInt64.max, using: &random),
            timestamp: HybridTimestamp(rawValue: random.next()), body: body())
    }
}

extension RandomEntries {
    /// Fields the store's API accepts: names from a small set (so updates
    /// overlap and merge), finite doubles, nesting well within the limit.
    public mutating func storeFields(countMax: Int = 4) -> Fields {
        let names = ["a", "b", "c", "title", "é"]
        return Fields((0..<int(0...countMax)).map { _ in (names[int(0...names.count - 1)], finite(value())) })
    }

    private func finite(_ value: Value) -> Value {
        switch value {
        case .double(let number) where !number.isFinite: .double(0)
        case .array(let elements): .array(elements.map(finite))
        case .object(let fields): .object(Fields(fields.map { (name: String, value: Value) in (name.isEmpty || NameRules.isReserved(name) ? "k" + name : name, finite(value)) }))
        default: value
        }
    }
}

extension RandomEntries {
    /// A body of any kind that a store accepts for appending: valid names
    /// and keys, store fields, cursors and versions (`Validation.entry`).
    public mutating func storeBody() -> EntryBody {
        let type = ["te", "prj", "ct"][int(0...2)]
        let id = "\(type)_\(int(0...50))"
        let version = UInt64(int(1...1_000_000))
        let offset = UInt64(int(1...1_000_000))
        let key = "key-\(random.next())"
        switch body() {
        case .intent(let intent):
            return .intent(
                Intent(
                    intent.operation, idempotencyKey: key, entityType: type, entityID: id, baseVersion: intent.baseVersion,
                    fields: intent.operation == .delete ? [:] : storeFields()))
        case .ack(let ack):
            return .ack(ack)
        case .reject(let reject):
            return .reject(reject)
        case .remote(let remote):
            return .remote(
                Remote(cursor: "c\(offset)", remote.operation, entityType: type, entityID: id, serverVersion: version, fields: storeFields()))
        case .conflict(let conflict):
            return .conflict(
                Conflict(
                    intentOffset: offset, entityType: type, entityID: id, serverVersion: version,
                    serverDeleted: conflict.serverDeleted, serverFields: storeFields(), resolution: conflict.resolution,
                    resolvedFields: storeFields()))
        case .resync(let reason):
            return .resync(reason: reason)
        case .snapshot(let snapshot):
            return .snapshot(
                Snapshot(
                    watermark: snapshot.watermark, cursor: snapshot.cursor.isEmpty ? "" : "c\(offset)", entityType: type, entityID: id,
                    serverVersion: version, deleted: false, fields: storeFields()))
        }
    }
}
