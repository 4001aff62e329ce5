public import CofferCrypto
public import CofferModel
public import CofferProtocol
import CofferSystem

/// The async client apps use: one agent connection, requests run one at a time on a dedicated
/// thread so blocking socket I/O never occupies Swift's cooperative pool.
///
/// ```swift
/// let client = try await CofferClient.connect()
/// let items = try await client.copyMatching(ItemQuery(itemClass: .genericPassword,
///     attributes: ["svce": .string("github"), "acct": .string("me")], returnData: true))
/// ```
public final class CofferClient: @unchecked Sendable {
    // @unchecked Sendable: `connection` is touched only by jobs serialised through `queue`.
    private let connection: Confined
    private let queue: SerialWorker

    /// Carries the non-Sendable connection between the worker jobs that alone use it.
    private final class Confined: @unchecked Sendable {
        let connection: AgentConnection
        init(_ c: AgentConnection) { connection = c }
    }

    private init(_ c: Confined, _ q: SerialWorker) {
        connection = c
        queue = q
    }

    /// Connects to the agent (socket as in ``AgentConnection/socketPath(explicit:)``).
    public static func connect(socket: String? = nil, clientName: String = "CofferClient") async throws(SecError) -> CofferClient {
        let path = AgentConnection.socketPath(explicit: socket)
        let worker = SerialWorker()
        let c = try await worker.run { () throws(SecError) in Confined(try AgentConnection(path: path, clientName: clientName)) }
        return CofferClient(c, worker)
    }

    private func run<T: Sendable>(_ body: @escaping @Sendable (AgentConnection) throws(SecError) -> T) async throws(SecError) -> T {
        let c = connection
        return try await queue.run { () throws(SecError) in try body(c.connection) }
    }

    /// STATUS.
    public func status() async throws(SecError) -> StatusReply { try await run { c throws(SecError) in try c.status() } }
    /// UNLOCK.
    public func unlock(passcode: SecureBytes) async throws(SecError) { try await run { c throws(SecError) in try c.unlock(passcode: passcode) } }
    /// LOCK.
    public func lock() async throws(SecError) { try await run { c throws(SecError) in try c.lock() } }
    /// SecItemAdd.
    @discardableResult
    public func add(_ item: NewItem, returning flags: ReturnFlags = []) async throws(SecError) -> ItemResult? {
        try await run { c throws(SecError) in try c.add(item, returning: flags) }
    }
    /// SecItemCopyMatching.
    public func copyMatching(_ query: ItemQuery) async throws(SecError) -> [ItemResult] {
        try await run { c throws(SecError) in try c.copyMatching(query) }
    }
    /// SecItemUpdate.
    @discardableResult
    public func update(_ query: ItemQuery, _ changes: ItemChanges) async throws(SecError) -> Int {
        try await run { c throws(SecError) in try c.update(query, changes) }
    }
    /// SecItemDelete.
    @discardableResult
    public func delete(_ query: ItemQuery) async throws(SecError) -> Int {
        try await run { c throws(SecError) in try c.delete(query) }
    }

    /// How this connection's later requests authenticate (an `LAContext`'s options: no user interface,
    /// an operation prompt, a passcode or application password given in advance, a reuse duration).
    public func setAuthenticationOptions(_ options: AuthenticationOptions) async throws(SecError) {
        try await run { c throws(SecError) in try c.setAuthenticationOptions(options) }
    }

    /// Who asks the person when an item needs authentication (a terminal, a pinentry, an app's own
    /// dialog); nil: such requests fail with errSecInteractionNotAllowed. Set before the requests.
    public func setAuthenticationDelegate(_ delegate: (any AuthenticationDelegate & Sendable)?) async throws(SecError) {
        try await run { c throws(SecError) in c.authenticationDelegate = delegate }
    }

    /// LocalAuthentication's canEvaluatePolicy: nil if `policy` can be evaluated now, else why not.
    public func canEvaluatePolicy(_ policy: LAPolicy) async throws(SecError) -> LAError? {
        let r = try await run { c throws(SecError) in try c.canEvaluate(policy) }
        return r.error.map { LAError($0, r.message) }
    }

    /// LocalAuthentication's evaluatePolicy (the delegate talks to the person): the domain state of
    /// the enrolled set on success (evaluatedPolicyDomainState), an LAError otherwise.
    public func evaluatePolicy(_ policy: LAPolicy, localizedReason reason: String) async throws(SecError) -> Result<[UInt8], LAError> {
        guard !reason.isEmpty else { throw .param("LocalAuthentication needs a non-empty reason") }
        let r = try await run { c throws(SecError) in try c.evaluate(policy, reason: reason) }
        if let e = r.error { return .failure(LAError(e, r.message)) }
        return .success(r.domainState)
    }
}

/// Runs jobs one after another on its own thread and resumes the awaiting task with the result.
final class SerialWorker: @unchecked Sendable {
    // @unchecked Sendable: `jobs` and `running` are guarded by `mutex`.
    private let mutex = PThreadMutex()
    private var jobs: [() -> Void] = []
    private var running = false

    /// The result travels from the worker thread to the awaiting task through a mutex, not inside
    /// the continuation: the continuation's own hand-off is an atomic in the concurrency runtime
    /// that ThreadSanitizer does not see, so a result built on the worker (a secret's bytes) was
    /// reported as racing with the task that reads it. The mutex makes the ordering explicit.
    func run<T: Sendable>(_ body: @escaping @Sendable () throws(SecError) -> T) async throws(SecError) -> T {
        let slot = ResultSlot<T>()
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            enqueue {
                do throws(SecError) { slot.store(.success(try body())) } catch { slot.store(.failure(error)) }
                done.resume()
            }
        }
        return try slot.take().get()
    }

    /// One job's result, handed over under a lock.
    private final class ResultSlot<T: Sendable>: @unchecked Sendable {
        // @unchecked Sendable: `result` is guarded by `mutex`.
        private let mutex = PThreadMutex()
        private var result: Result<T, SecError>?

        func store(_ r: Result<T, SecError>) { mutex.withLock { result = r } }
        func take() -> Result<T, SecError> {
            mutex.withLock {
                defer { result = nil }
                return result!
            }
        }
    }

    /// Queues a job; starts a worker thread if none is running. The worker exits when the queue is
    /// empty, so an idle client holds no thread.
    private func enqueue(_ job: @escaping () -> Void) {
        let start: Bool = mutex.withLock {
            jobs.append(job)
            defer { running = true }
            return !running
        }
        if start { Threads.detach { [self] in drain() } }
    }

    private func drain() {
        while true {
            let job: (() -> Void)? = mutex.withLock {
                if jobs.isEmpty { running = false; return nil }
                return jobs.removeFirst()
            }
            guard let job else { return }
            job()
        }
    }
}
