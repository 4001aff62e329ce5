import CSodium
import Glibc
import CofferSystem

/// Slabs of guarded, locked memory carved into fixed-size chunks for short-lived secrets.
///
/// A `sodium_malloc` + `sodium_free` pair costs about 25 µs here (mmap, two mprotects, mlock,
/// munmap) and four memory mappings; a keychain lookup needs several secret buffers. The pool pays
/// that once per slab: chunks are handed out under a mutex, wiped with `sodium_memzero` when
/// released, and reused. Slabs keep libsodium's guard pages around the slab (not between chunks)
/// and stay locked; the pool is capped so it fits well inside RLIMIT_MEMLOCK (8 MiB for users).
/// Requests larger than the biggest chunk, or beyond the cap, get a dedicated `sodium_malloc`.
enum SecurePool {
    @unsafe struct SizeClass {
        let chunk: Int
        let slabBytes: Int
        var slabs = 0
        var free: [UnsafeMutableRawPointer] = unsafe []
    }

    /// Most slabs per size class (worst case locked by the pool: 16 × 128 KiB = 2 MiB).
    static let maxSlabsPerClass = 16

    /// Chunk size of each class (fixed; read without the lock).
    static let chunkSizes = [64, 256, 1024, 4096]

    private static let mutex = PThreadMutex()
    nonisolated(unsafe) private static var classes: [SizeClass] = unsafe ([
        SizeClass(chunk: 64, slabBytes: 16 << 10),
        SizeClass(chunk: 256, slabBytes: 16 << 10),
        SizeClass(chunk: 1024, slabBytes: 32 << 10),
        SizeClass(chunk: 4096, slabBytes: 64 << 10),
    ])

    /// The size class index for `size` bytes, or nil if too large for the pool.
    static func classIndex(for size: Int) -> Int? {
        switch size {
        case ...64: 0
        case ...256: 1
        case ...1024: 2
        case ...4096: 3
        default: nil
        }
    }

    /// A zeroed chunk of at least `size` bytes, or nil when the pool cannot serve it.
    static func take(_ size: Int) -> (UnsafeMutableRawPointer, Int)? {
        guard let ci = classIndex(for: size) else { return nil }
        return unsafe mutex.withLock { () -> (UnsafeMutableRawPointer, Int)? in
            if unsafe classes[ci].free.isEmpty {
                guard unsafe classes[ci].slabs < maxSlabsPerClass else { return nil }
                // A slab is kept for the life of the process: its budget is never returned.
                guard let (slab, _) = unsafe SecureMemory.lockedRegion(classes[ci].slabBytes) else { return nil }
                let bytes = unsafe classes[ci].slabBytes
                unsafe classes[ci].slabs += 1
                let chunk = unsafe classes[ci].chunk
                for off in stride(from: bytes - chunk, through: 0, by: -chunk) { unsafe classes[ci].free.append(slab + off) }
            }
            return unsafe (classes[ci].free.removeLast(), ci)
        }
    }

    /// Wipes a chunk and returns it to its size class.
    static func give(_ p: UnsafeMutableRawPointer, classIndex ci: Int) {
        unsafe sodium_memzero(p, chunkSizes[ci])
        mutex.withLock { unsafe classes[ci].free.append(p) }
    }
}
