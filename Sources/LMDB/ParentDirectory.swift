/// The directory that holds `path`'s last component: the text before its
/// last slash, or "/" when that slash is the first character; nil for a
/// path with no slash (a name in the working directory). Found by hand:
/// Foundation on Linux traps on `deletingLastPathComponent` of a path of
/// one character.
public func parentDirectory(of path: String) -> String? {
    guard let slash = path.lastIndex(of: "/") else { return nil }
    return slash == path.startIndex ? "/" : String(path[..<slash])
}
