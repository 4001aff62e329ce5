import CTPM

/// A TPM NV monotonic counter (TPM_NT_COUNTER) in the owner hierarchy: a 64-bit value that only
/// grows, survives reboots and TPM restarts, and cannot be set back (only undefining the index and
/// defining it again resets it, which needs the owner's authorization). Part 3 of issue #28 binds
/// the keybag's version to one.
///
/// Attributes `ownerwrite|ownerread|nt=counter` (`tpm2_nvdefine -a "ownerread|ownerwrite|nt=counter"`),
/// 8 bytes, SHA-256 name, an empty index auth and no policy; authorized by the owner hierarchy with
/// its auth empty, as a TPM that was never provisioned (and swtpm) has it.
public struct TPMNVCounter: Equatable, Sendable {
    /// The NV index (a handle 0x01xxxxxx).
    public let index: UInt32

    /// The index Coffer uses unless configured otherwise: in the owner range 0x01000000–0x013FFFFF the
    /// TCG's handle registry leaves to owners.
    public static let defaultIndex: UInt32 = 0x0100_C0FF
    /// TPMA_NV_OWNERWRITE | TPM_NT_COUNTER << 4 | TPMA_NV_OWNERREAD.
    static let attributes: UInt32 = 1 << 1 | 1 << 4 | 1 << 17
    /// TPMA_NV_WRITTEN: set by the TPM at the first increment; not part of the definition.
    static let writtenBit: UInt32 = 1 << 29
    /// A counter's size.
    static let dataSize: UInt16 = 8

    /// The counter at `index`, as it is (nothing is sent to the TPM: ``define(index:on:)`` makes one).
    public init(index: UInt32) {
        self.index = index
    }

    /// Opens the counter at `index`, defining it (TPM2_NV_DefineSpace) and incrementing it once
    /// (so it can be read) if it is not there. An index already defined with other attributes, size or
    /// name algorithm is refused (``TPMError/nvIndexConflict(index:reason:)``) and left alone.
    public static func define(index: UInt32 = defaultIndex, on tpm: TPM) throws(TPMError) -> TPMNVCounter {
        guard index >> 24 == 0x01 else { throw .invalidArgument("\(hex(index)) is not an NV index (0x01000000–0x01FFFFFF)") }
        let counter = TPMNVCounter(index: index)
        try unsafe tpm.withContext { ctx throws(TPMError) in
            if try unsafe defined(index, ctx, tpm) {
                var attributes: UInt32 = 0, size: UInt16 = 0, nameAlg: UInt16 = 0
                try tpm.check(unsafe ctpm_nv_read_public(ctx, index, &attributes, &size, &nameAlg), "TPM2_NV_ReadPublic")
                guard attributes & ~writtenBit == Self.attributes, size == dataSize, nameAlg == TPMAlgorithm.sha256 else {
                    throw .nvIndexConflict(index: index, reason: "attributes 0x\(String(attributes, radix: 16)), \(size) bytes, "
                        + "name algorithm 0x\(String(nameAlg, radix: 16)); a Coffer counter has attributes 0x\(String(Self.attributes, radix: 16)) "
                        + "(ownerwrite|nt=counter|ownerread), 8 bytes, SHA-256")
                }
                if attributes & writtenBit != 0 { return }
            } else {
                try tpm.check(unsafe ctpm_nv_define(ctx, index, Self.attributes, dataSize, TPMAlgorithm.sha256), "TPM2_NV_DefineSpace")
            }
            try tpm.check(unsafe ctpm_nv_increment(ctx, index), "TPM2_NV_Increment")
        }
        return counter
    }

    /// True if an NV index is defined at `index`, false if the TPM has none there: rollback detection
    /// reads "never anchored" from an absent counter. Asked through TPM2_GetCapability(TPM_CAP_HANDLES),
    /// not by a TPM2_NV_ReadPublic that fails: ESAPI logs every failed command on standard error, and
    /// an absent counter is no error.
    public static func isDefined(index: UInt32, on tpm: TPM) throws(TPMError) -> Bool {
        try unsafe tpm.withContext { ctx throws(TPMError) -> Bool in try unsafe defined(index, ctx, tpm) }
    }

    /// Whether `index` is defined (TPM2_GetCapability of the handles from `index`). Call under the lock.
    private static func defined(_ index: UInt32, _ ctx: OpaquePointer, _ tpm: TPM) throws(TPMError) -> Bool {
        var defined: Int32 = 0
        try tpm.check(unsafe ctpm_nv_defined(ctx, index, &defined), "TPM2_GetCapability")
        return defined != 0
    }

    /// The counter's value (TPM2_NV_Read, 8 bytes big-endian).
    public func read(on tpm: TPM) throws(TPMError) -> UInt64 {
        try unsafe tpm.withContext { ctx throws(TPMError) -> UInt64 in
            var bytes = [UInt8](repeating: 0, count: Int(Self.dataSize))
            try tpm.check(unsafe ctpm_nv_read(ctx, index, &bytes, Self.dataSize), "TPM2_NV_Read")
            return bytes.reduce(0) { $0 << 8 | UInt64($1) }
        }
    }

    /// Adds one to the counter (TPM2_NV_Increment, one NV write) and returns the new value.
    @discardableResult
    public func increment(on tpm: TPM) throws(TPMError) -> UInt64 {
        try unsafe tpm.withContext { ctx throws(TPMError) in try tpm.check(unsafe ctpm_nv_increment(ctx, index), "TPM2_NV_Increment") }
        return try read(on: tpm)
    }

    /// Removes the index (TPM2_NV_UndefineSpace by the owner): for tests and administrators' tools.
    public func undefine(on tpm: TPM) throws(TPMError) {
        try unsafe tpm.withContext { ctx throws(TPMError) in try tpm.check(unsafe ctpm_nv_undefine(ctx, index), "TPM2_NV_UndefineSpace") }
    }

    /// `v` as eight hex digits after "0x".
    public static func hex(_ v: UInt32) -> String {
        let digits = String(v, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, 8 - digits.count)) + digits
    }
}
