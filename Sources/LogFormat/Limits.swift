/// The bounds of the format (`Format/limits.md`). The codec enforces the
/// entry size and the nesting depth on both encode and decode, so it never
/// allocates or recurses without bound and never writes what it would refuse.
/// The name and key lengths are enforced where names enter the store (its
/// API and pulled changes), because they exist for LMDB's key limit.
public enum Limits {
    /// The largest entry body in bytes (4 MiB). Entries are single intents or
    /// server changes; anything larger belongs in a blob store, and the bound
    /// keeps a corrupt length field from asking for gigabytes.
    public static let entryBodyBytesMax = 4 * 1024 * 1024

    /// How deep arrays and objects may nest inside a `Value`. Decoding is
    /// recursive, so this bounds the stack a hostile entry can consume.
    public static let valueDepthMax = 32

    /// The longest entity type name in UTF-8 bytes. Type names are part of
    /// LMDB keys (with the entity id), which LMDB caps at 511 bytes.
    public static let entityTypeBytesMax = 64

    /// The longest entity id in UTF-8 bytes (keys must stay under LMDB's 511).
    public static let entityIDBytesMax = 256

    /// The longest idempotency key in UTF-8 bytes; it is an LMDB key too.
    public static let idempotencyKeyBytesMax = 256
}
