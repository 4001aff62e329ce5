import CSodium
import Glibc
import CofferSystem

/// Owner of secret bytes in libsodium's guarded, locked memory (`sodium_malloc`).
///
/// The bytes sit between guard pages, are `mlock`ed where the RLIMIT_MEMLOCK budget allows,
/// and are wiped by `sodium_free` (which calls `sodium_memzero`) when the owner is released.
/// Secrets never leave this type as `String`, `Data` or `[UInt8]` inside Coffer's libraries:
/// callers borrow them through `withUnsafeBytes`.
///
/// `sodium_malloc` does not fail when `mlock` fails, so every allocation is checked with its
/// own `mlock` call; the outcome is counted in ``SecureMemory``.
///
/// Small buffers come from ``SecurePool`` (locked arenas, chunks wiped on release); larger ones
/// get their own `sodium_malloc` with guard pages.
@safe public final class SecureBytes: @unchecked Sendable {
    // @unchecked Sendable: the bytes are written only by the creating code before it shares the
    // buffer, or by an owner that serialises every write (the keybag writes its key arena only
    // inside its `Protected.withLock`); everyone else only reads.
    private let base: UnsafeMutableRawPointer
    /// Number of secret bytes.
    public let count: Int
    /// Where the bytes live, which decides how they are released.
    private let storage: Storage

    private enum Storage {
        /// A chunk of a ``SecurePool`` arena, of this size class.
        case pool(Int)
        /// A dedicated `sodium_malloc` region holding this many bytes of the lock budget.
        case sodium(lockedBytes: Int)
        /// Over budget: a private anonymous mapping of this size (MADV_DONTDUMP, not locked).
        case unlocked(mappedBytes: Int)
    }

    /// Allocates `count` zeroed bytes of guarded, locked memory (from ``SecurePool`` when small).
    /// Past the process's locked-memory budget (``SecureMemory/lockBudget``) the bytes are still
    /// private, excluded from core dumps and wiped on release, but not locked (they could be swapped).
    public init(count: Int) {
        Sodium.ensureInitialized()
        precondition(count >= 0, "negative size")
        self.count = count
        let size = Swift.max(count, 1)
        if let (p, ci) = unsafe SecurePool.take(size) {
            unsafe base = p
            storage = .pool(ci)
        } else if let region = unsafe SecureMemory.lockedRegion(size) {
            unsafe base = region.pointer
            storage = unsafe .sodium(lockedBytes: region.lockedBytes)
        } else {
            unsafe base = SecureMemory.unlockedRegion(size)
            storage = .unlocked(mappedBytes: SecureMemory.mappedSize(size))
        }
        SecureMemory.noteLive(+1)
    }

    /// Copies `bytes` into a new guarded buffer. The caller remains responsible for wiping its source.
    public convenience init(copying bytes: UnsafeRawBufferPointer) {
        self.init(count: bytes.count)
        if bytes.count > 0, let src = bytes.baseAddress { unsafe memcpy(base, src, bytes.count) }
    }

    /// The bytes of `pieces`, one after another, in a new guarded buffer (an Assuan answer sent as
    /// several `D` lines). The pieces are left as they are.
    public convenience init(concatenating pieces: [SecureBytes]) {
        self.init(count: pieces.reduce(0) { $0 + $1.count })
        var n = 0
        for p in pieces where p.count > 0 {
            unsafe memcpy(base + n, p.base, p.count)
            n += p.count
        }
    }

    /// Copies `bytes` into a guarded buffer and wipes the array's storage in place.
    public convenience init(consuming bytes: inout [UInt8]) {
        self.init(count: bytes.count)
        unsafe bytes.withUnsafeMutableBytes { raw in
            if raw.count > 0 {
                unsafe memcpy(base, raw.baseAddress!, raw.count)
                unsafe sodium_memzero(raw.baseAddress!, raw.count)
            }
        }
        bytes.removeAll()
    }

    /// A buffer of `count` bytes from the CSPRNG (`randombytes_buf`).
    public static func random(count: Int) -> SecureBytes {
        let s = SecureBytes(count: count)
        if count > 0 { unsafe randombytes_buf(s.base, count) }
        return s
    }

    deinit {
        SecureMemory.noteLive(-1)
        switch storage {
        case .pool(let ci):
            unsafe SecurePool.give(base, classIndex: ci) // wipes
        case .sodium(let locked):
            unsafe sodium_free(base) // wipes before unmapping
            SecureMemory.returnBudget(locked)
        case .unlocked(let mapped):
            unsafe sodium_memzero(base, mapped)
            unsafe munmap(base, mapped)
        }
    }

    /// Borrows the bytes read-only.
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        unsafe try body(UnsafeRawBufferPointer(start: base, count: count))
    }

    /// Borrows the bytes for writing; for the code that builds the secret.
    public func withUnsafeMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        unsafe try body(UnsafeMutableRawBufferPointer(start: base, count: count))
    }

    /// Overwrites the bytes with zeros (`sodium_memzero`) ahead of release.
    public func wipe() { unsafe sodium_memzero(base, Swift.max(count, 1)) }

    /// Overwrites bytes `range` with zeros (`sodium_memzero`, which the compiler may not elide), for
    /// an owner that reuses parts of one buffer (the keybag's key arena wipes one key slot).
    public func wipe(_ range: Range<Int>) {
        precondition(range.lowerBound >= 0 && range.upperBound <= count, "wipe range out of bounds")
        if !range.isEmpty { unsafe sodium_memzero(base + range.lowerBound, range.count) }
    }

    /// Constant-time comparison (`sodium_memcmp`); false when lengths differ.
    public func constantTimeEquals(_ other: SecureBytes) -> Bool {
        guard count == other.count else { return false }
        if count == 0 { return true }
        return unsafe other.withUnsafeBytes { unsafe sodium_memcmp(base, $0.baseAddress!, count) == 0 }
    }

    /// A new buffer holding bytes `range` of this one.
    public func slice(_ range: Range<Int>) -> SecureBytes {
        precondition(range.lowerBound >= 0 && range.upperBound <= count)
        return unsafe SecureBytes(copying: UnsafeRawBufferPointer(start: base + range.lowerBound, count: range.count))
    }
}

/// Accounting for guarded memory: how many secure buffers exist, how many bytes Coffer has locked,
/// and the budget that keeps it within RLIMIT_MEMLOCK.
///
/// Every locked region (pool arena or dedicated buffer) is charged to ``lockBudget`` *before* it is
/// allocated, so the process never asks the kernel to lock more than the limit — not even as root,
/// whose CAP_IPC_LOCK would let it. A region the budget cannot cover is served unlocked and counted
/// in ``unlockedAllocations`` (the agent warns about it).
public enum SecureMemory {
    private struct Counters { var live = 0; var unlocked = 0; var charged = 0 }
    // A pthread mutex (CofferSystem.Lock) rather than Synchronization.Mutex, whose futex-based
    // locking ThreadSanitizer cannot see on Linux (it reports every access as a race).
    private static let lock = PThreadMutex()
    nonisolated(unsafe) private static var state = Counters()
    private static func withCounters<R>(_ body: (inout Counters) -> R) -> R { lock.withLock { unsafe body(&state) } }

    /// Bytes Coffer may lock: the RLIMIT_MEMLOCK soft limit read at first use (nil: unlimited).
    public static let lockBudget: Int? = lockLimit()

    static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))

    /// What locking `size` user bytes costs: libsodium locks the page-rounded region plus its canary page.
    static func lockCost(_ size: Int) -> Int { ((size + pageSize - 1) / pageSize + 1) * pageSize }

    /// Charges `bytes` to the budget; false (and nothing charged) if that would exceed it.
    static func chargeBudget(_ bytes: Int) -> Bool {
        withCounters { c in
            if let budget = lockBudget, c.charged + bytes > budget { return false }
            c.charged += bytes
            return true
        }
    }

    /// Returns bytes charged with ``chargeBudget(_:)``.
    static func returnBudget(_ bytes: Int) { withCounters { $0.charged -= bytes } }

    /// A zeroed `sodium_malloc` region of `size` bytes charged to the budget, or nil if the budget is spent.
    static func lockedRegion(_ size: Int) -> (pointer: UnsafeMutableRawPointer, lockedBytes: Int)? {
        let cost = lockCost(size)
        guard chargeBudget(cost) else { return nil }
        guard let p = unsafe sodium_malloc(size) else {
            // Address-space exhaustion: continuing without guarded memory would be unsafe.
            fatalError("sodium_malloc failed: out of memory for secure buffers")
        }
        unsafe sodium_memzero(p, size)
        unsafe verifyLocked(pointer: p, size: size)
        return unsafe (p, cost)
    }

    /// Size of the mapping ``unlockedRegion(_:)`` makes for `size` bytes.
    static func mappedSize(_ size: Int) -> Int { (size + pageSize - 1) / pageSize * pageSize }

    /// A zeroed private mapping excluded from core dumps, for buffers past the lock budget (counted).
    static func unlockedRegion(_ size: Int) -> UnsafeMutableRawPointer {
        withCounters { $0.unlocked += 1 }
        let bytes = mappedSize(size)
        guard let p = unsafe mmap(nil, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), unsafe p != MAP_FAILED else {
            fatalError("mmap failed: out of memory for secure buffers")
        }
        _ = unsafe madvise(p, bytes, MADV_DONTDUMP)
        return unsafe p
    }

    /// sodium_malloc ignores mlock failure; ask again to learn the truth (mlock is idempotent).
    static func verifyLocked(pointer: UnsafeMutableRawPointer, size: Int) {
        let start = Int(bitPattern: pointer) & ~(pageSize - 1)
        let end = (Int(bitPattern: pointer) + size + pageSize - 1) & ~(pageSize - 1)
        let ok = unsafe mlock(UnsafeRawPointer(bitPattern: start), end - start) == 0
        if !ok { withCounters { $0.unlocked += 1 } }
    }

    static func noteLive(_ delta: Int) { withCounters { $0.live += delta } }

    /// Number of secure buffers currently allocated.
    public static var liveAllocations: Int { withCounters { $0.live } }

    /// Number of secure buffers or pool arenas served unlocked since start (the budget was spent, or the kernel refused mlock).
    public static var unlockedAllocations: Int { withCounters { $0.unlocked } }

    /// Bytes currently charged to ``lockBudget``.
    public static var chargedBytes: Int { withCounters { $0.charged } }

    /// Bytes this process has locked, read from `VmLck` in /proc/self/status (nil if unreadable).
    public static func lockedBytes() -> Int? {
        guard let f = unsafe fopen("/proc/self/status", "r") else { return nil }
        defer { unsafe fclose(f) }
        var line = [CChar](repeating: 0, count: 256)
        while unsafe fgets(&line, Int32(line.count), f) != nil {
            let s = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if s.hasPrefix("VmLck:") {
                let digits = s.dropFirst(6).filter { $0.isNumber }
                return Int(digits).map { $0 * 1024 }
            }
        }
        return nil
    }

    /// The RLIMIT_MEMLOCK soft limit in bytes (nil means unlimited).
    public static func lockLimit() -> Int? {
        var rl = rlimit()
        guard unsafe getrlimit(Int32(__RLIMIT_MEMLOCK.rawValue), &rl) == 0 else { return nil }
        return rl.rlim_cur == rlim_t.max ? nil : Int(rl.rlim_cur)
    }
}

/// Wipes an array's storage with `sodium_memzero` (for wire buffers that carried a secret).
public func secureZero(_ bytes: inout [UInt8]) {
    unsafe bytes.withUnsafeMutableBytes { if $0.count > 0 { unsafe sodium_memzero($0.baseAddress!, $0.count) } }
}
