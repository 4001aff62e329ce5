import CofferCrypto
import CofferProtocol
import Glibc

/// Locked memory for large frame bodies, shared by all connections.
///
/// Frame bodies are read into locked memory because they may carry secrets. Small ones come from
/// the secure pool; a large one (up to ``WireFormat/maximumBodyBytes``) is a dedicated locked
/// region. Without a cap, 64 clients each sending a 256 KiB frame would ask for 16 MiB of locked
/// memory, twice the usual RLIMIT_MEMLOCK, and push key material out of it. So large bodies draw
/// on this budget (a quarter of the lock budget, at least one maximal frame): a frame that does not
/// fit waits for others to finish (the rest of it stays in the socket buffer: backpressure), and
/// a connection that cannot get its budget within the I/O timeout is closed.
///
/// What one client may hold is capped twice: a connection holds at most one frame's budget at a
/// time, for at most the frame deadline (``Connection/Limits/frameSeconds``), and all connections
/// of one process (peer pid) together hold at most ``perOwnerCap`` (half the budget, at least one
/// maximal frame), so one process dripping large frames on many connections cannot take it all.
final class FrameBudget: @unchecked Sendable {
    // @unchecked Sendable: `available` and `held` are guarded by `mutex`; `cond` is used with it.
    // (Heap-allocated: pthread objects must not move, and a Swift property's address is not stable.)
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let cond = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var available: Int
    /// Bytes held per owner (peer pid).
    private var held: [Int32: Int] = [:]
    /// Total bytes the budget holds.
    let capacity: Int
    /// Most bytes one owner may hold at once.
    let perOwnerCap: Int

    /// Bodies at most this large come from the secure pool and need no budget.
    static let poolServedBytes = 4096

    init(capacity: Int) {
        self.capacity = capacity
        perOwnerCap = min(capacity, max(WireFormat.maximumBodyBytes, capacity / 2))
        available = capacity
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        cond.initialize(to: pthread_cond_t())
        var attr = pthread_condattr_t()
        pthread_condattr_init(&attr)
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(cond, &attr)
        pthread_condattr_destroy(&attr)
    }

    /// The default: a quarter of the process's lock budget, and room for at least one maximal frame.
    static func standard() -> FrameBudget {
        let lockBudget = SecureMemory.lockBudget ?? (8 << 20)
        return FrameBudget(capacity: max(WireFormat.maximumBodyBytes, lockBudget / 4))
    }

    deinit {
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        cond.deallocate()
        mutex.deallocate()
    }

    /// What ``acquire(_:owner:timeout:)`` granted: give it back with ``release(_:)``.
    struct Grant: Sendable {
        let bytes: Int
        let owner: Int32
        static let none = Grant(bytes: 0, owner: 0)
    }

    /// Takes `bytes` (0 for a pool-served body) for `owner`, waiting up to `timeout` seconds for
    /// enough to be free and for `owner` to stay within ``perOwnerCap``; nil on timeout.
    func acquire(_ bytes: Int, owner: Int32, timeout: Double) -> Grant? {
        guard bytes > 0 else { return Grant.none }
        let need = min(bytes, capacity)
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let whole = Int(timeout)
        var deadline = timespec(tv_sec: now.tv_sec + whole, tv_nsec: now.tv_nsec + Int((timeout - Double(whole)) * 1e9))
        if deadline.tv_nsec >= 1_000_000_000 { deadline.tv_sec += 1; deadline.tv_nsec -= 1_000_000_000 }
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        func fits() -> Bool { available >= need && held[owner, default: 0] + need <= perOwnerCap }
        while !fits() {
            if pthread_cond_timedwait(cond, mutex, &deadline) == ETIMEDOUT && !fits() { return nil }
        }
        available -= need
        held[owner, default: 0] += need
        return Grant(bytes: need, owner: owner)
    }

    /// Returns what ``acquire(_:owner:timeout:)`` granted.
    func release(_ grant: Grant) {
        guard grant.bytes > 0 else { return }
        pthread_mutex_lock(mutex)
        available += grant.bytes
        let left = held[grant.owner, default: 0] - grant.bytes
        held[grant.owner] = left > 0 ? left : nil
        pthread_cond_broadcast(cond)
        pthread_mutex_unlock(mutex)
    }

    /// The budget a body of `length` bytes needs (0 when the secure pool serves it).
    static func cost(ofBody length: Int) -> Int { length > poolServedBytes ? length : 0 }
}
