// The libFuzzer entry point of `Tools/fuzz/run`'s page fuzzer. It is
// compiled into one module with the LMDB module's `DataFile.swift` and
// `PageWalk.swift`: the part of `Environment.checkPages` that reads
// `data.mdb` itself, which meets every byte of a damaged file (the rest is
// LMDB's open and a read transaction). A trap or a sanitizer report is a
// finding.

import Foundation

/// The file each input is written to, made once and unlinked at once.
private let descriptor: Int32 = {
    var template = Array("/tmp/fuzz-pages-XXXXXX".utf8CString)
    let descriptor = mkstemp(&template)
    guard descriptor >= 0 else { fatalError("mkstemp: errno \(errno)") }
    unlink(template)
    return descriptor
}()

/// An input is a `data.mdb`, checked as of each of its two meta pages, with
/// the page size its first meta page states (as LMDB takes it).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: size)
    guard size >= DataFile.metaTransactionID + 8 else { return 0 }
    let file = DataFile.Bytes(bytes: Array(bytes))
    let pageSize = Int(file.u32(DataFile.freeDatabaseRecord))
    guard (256...65_536).contains(pageSize) else { return 0 }
    guard ftruncate(descriptor, 0) == 0, pwrite(descriptor, data, size, 0) == size else { fatalError("writing the input: errno \(errno)") }
    let reader = DataFile.PageReader(descriptor: descriptor, pageSize: pageSize, fileSize: size)
    for meta in 0..<2 where (meta + 1) * pageSize <= size {
        let transactionID = file.u64(meta * pageSize + DataFile.metaTransactionID)
        _ = PageWalk.check(reader, transactionID: transactionID, problemCountMax: 100)
    }
    return 0
}
