import Foundation

/// Damage for tests of the page check: writes over the page number in the
/// header of every page of the LMDB data file at `path` past its two meta
/// pages (0xEE bytes: page 17216961135462248174), which the check names at
/// the first page it reads and LMDB follows unchecked.
/// - Returns: the file's bytes as they are now.
public func damagePageHeaders(ofDataFile path: String) throws -> Data {
    guard var bytes = FileManager.default.contents(atPath: path) else { throw CocoaError(.fileReadNoSuchFile) }
    let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
    for page in 2..<bytes.count / pageSize {
        bytes.replaceSubrange(page * pageSize..<page * pageSize + 8, with: [UInt8](repeating: 0xEE, count: 8))
    }
    try bytes.write(to: URL(fileURLWithPath: path))
    return bytes
}
