import CSodium
import Glibc
import CofferSystem

/// Locked arenas carved into fixed-size chunks for short-lived secrets.
///
/// A `sodium_malloc` + `sodium_free` pair costs about 25 µs here (mmap, two mprotects, two mlocks,
/// munmap) and four memory mappings; a keychain lookup needs several secret buffers. The pool pays
/// that once per arena: chunks are handed out under a mutex, wiped with `sodium_memzero` when
/// released, and reused. Arenas keep libsodium's guard pages around the arena (not between chunks)
/// and stay locked for the life of the process.
///
/// Every size class takes a page at a time from the same arena, so a short-lived client (`coffer
/// get`, the git helper, one `SecItemCopyMatching`) that needs chunks of three sizes locks one
/// region, not one per size (the git helper locked three, and `mlock` was the largest part of its
/// time in the kernel). The first arena is small (16 KiB: a page for each of the four size
/// classes), the later ones larger (64 KiB), so that the agent, which uses many, maps few. The pool
/// is capped so that it fits well inside RLIMIT_MEMLOCK (8 MiB for users). Requests larger than the
/// biggest chunk, or beyond the cap, get a dedicated `sodium_malloc`.
enum SecurePool {
    /// Chunk size of each class (fixed; read without the lock).
    static let chunkSizes = [64, 256, 1024, 4096]

    /// What a size class takes from an arena when its free list is empty: one page.
    static let refillBytes = 4096
    /// The first arena's size.
    static let firstArenaBytes = 16 << 10
    /// Every later arena's size.
    static let arenaBytes = 64 << 10
    /// Most bytes held in arenas: what the pool may lock at worst (2 MiB, as its 16 slabs of each
    /// size class could before).
    static let maximumPooledBytes = 2 << 20

    /// The chunks not in use and the newest arena's unused part. Its own type, with the arena maker
    /// passed in, so that tests can watch which arenas a run of allocations makes.
    @unsafe struct State {
        /// Per size class, the chunks not in use.
        var free: [[UnsafeMutableRawPointer]] = unsafe Array(repeating: [], count: 4)
        /// The unused part of the newest arena, from `next`, `left` bytes.
        var next: UnsafeMutableRawPointer? = nil
        var left = 0
        /// Bytes of all the arenas made.
        var pooled = 0

        /// A chunk of size class `ci`, refilling the class with a page of the newest arena when it
        /// has none free, and making a new arena with `makeArena(bytes)` when that one is used up;
        /// nil at the cap or when `makeArena` cannot (past the lock budget).
        mutating func take(_ ci: Int, makeArena: (Int) -> UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
            if unsafe free[ci].isEmpty {
                if unsafe left < refillBytes {
                    // Arenas are whole pages: nothing of the old one is left over.
                    let bytes = unsafe pooled == 0 ? firstArenaBytes : arenaBytes
                    guard unsafe pooled + bytes <= maximumPooledBytes, let arena = unsafe makeArena(bytes) else { return nil }
                    unsafe next = arena
                    unsafe left = bytes
                    unsafe pooled += bytes
                }
                guard let page = unsafe next else { return nil }
                unsafe next = page + refillBytes
                unsafe left -= refillBytes
                let chunk = chunkSizes[ci]
                for off in stride(from: refillBytes - chunk, through: 0, by: -chunk) { unsafe free[ci].append(page + off) }
            }
            return unsafe free[ci].removeLast()
        }
    }

    private static let mutex = PThreadMutex()
    nonisolated(unsafe) private static var state = unsafe State()

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
            guard let p = unsafe state.take(ci, makeArena: { unsafe SecureMemory.lockedRegion($0)?.pointer }) else { return nil }
            return unsafe (p, ci)
        }
    }

    /// Wipes a chunk and returns it to its size class.
    static func give(_ p: UnsafeMutableRawPointer, classIndex ci: Int) {
        unsafe sodium_memzero(p, chunkSizes[ci])
        mutex.withLock { unsafe state.free[ci].append(p) }
    }
}
