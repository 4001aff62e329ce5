import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// The Secret Service front end (issue #26) on one bus connection: the `org.freedesktop.Secret.Service`
/// object with `OpenSession`, one `org.freedesktop.Secret.Session` object per open session, and for
/// each sender its own connection to cofferd delegated to the sender's process (DELEGATE) before
/// anything else is done for it. Single-threaded: everything runs in ``run()``'s loop.
///
/// Collections, items, searches, aliases, secrets and prompts are served by the methods in
/// SecretServiceObjects.swift and the files beside it (one per D-Bus object), on fallback vtables (no object registered per item).
public final class SecretServiceFrontEnd {
    /// The bus name, the service object and where session objects live.
    public static let busName = "org.freedesktop.secrets"
    public static let servicePath = "/org/freedesktop/secrets"
    public static let sessionPathPrefix = "/org/freedesktop/secrets/session/"
    /// How many sessions one sender may hold at once.
    public static let sessionsPerSender = 16
    /// How long (seconds) the front end waits for the agent's answer to HELLO and DELEGATE.
    static let agentReplyTimeout = 10.0

    /// How many distinct senders the front end serves at once unless `--max-senders` says otherwise
    /// (each holds an agent connection, one descriptor here and one in the agent).
    public static let defaultMaxSenders = 256
    /// How many of those senders one process may hold unless `--max-senders-per-process` says
    /// otherwise: a process that opens bus connections in a loop is refused LimitsExceeded at this
    /// many, while every other process is still served (SecretServiceMapping.md, Limits).
    public static let defaultMaxSendersPerProcess = 32

    /// One bus sender: its delegated agent connection and its sessions (by object path). The
    /// connection is replaced by a new delegated one when the agent has closed it (the agent restarted).
    final class Peer {
        var agent: AgentConnection
        /// The caller's access groups (the agent's WHOAMI, never empty); the first, its default
        /// group, holds its collections, and each other one a collection of its own.
        var groups: [String]
        var group: String { groups[0] }
        /// The sender's process, as DELEGATE named it: a prompt's own connection delegates to it again.
        var process: DelegatedProcess
        var sessions: [String: OpenSession] = [:]
        /// The sender's last Service.SearchItems (its attributes and the keychain items it found, with
        /// their references), so that a GetSecrets of any of those items is one agent query.
        var lastSearch: LastSearch?
        /// The persistent collections the sender was shown (`login`, and every name Collections gave
        /// it): those whose `Locked` and changes are announced to it.
        var shown: Set<String> = [SecretServiceFrontEnd.loginCollection]
        /// Items the sender was shown locked (their reference paths, at most
        /// ``SecretServiceFrontEnd/maxLockedShown``): when the keybag unlocks, each is announced
        /// readable (PropertiesChanged of its Locked, Label, Attributes …), so that a client that
        /// keeps a proxy's properties does not go on showing it blank.
        var lockedShown: Set<String> = []
        init(agent: AgentConnection, groups: [String], process: DelegatedProcess) {
            self.agent = agent
            self.groups = groups
            self.process = process
        }
    }

    /// A sender's process: its pidfd (owned: closed when this goes), pid and start time.
    package final class DelegatedProcess: @unchecked Sendable {
        package let pidfd: Int32
        package let pid: Int32
        package let startTime: UInt64
        init(pidfd: Int32, pid: Int32, startTime: UInt64) {
            self.pidfd = pidfd
            self.pid = pid
            self.startTime = startTime
        }
        deinit { close(pidfd) }
    }

    struct OpenSession {
        let session: SecretServiceSession
        let slot: OpaquePointer
    }

    /// A sender's last search: what it asked for and the paths of the keychain items it was given.
    struct LastSearch {
        let attributes: Attributes
        /// The keychain items found, by persistent reference (GetSecrets reads them by reference).
        let byRef: [[UInt8]: Record]
        /// The same items' references by object path: a property read or a GetSecrets names an item
        /// by its path, and finds it here at once, not by going through every item found.
        let refByPath: [String: [UInt8]]
        /// Every write the front end had made, and every change the agent had told, before the
        /// search; nil if no watch of item changes ran (the search's records are then never reused
        /// as they are: GetSecrets still reads the items afresh by their references).
        let mark: ChangeMark?
    }

    let bus: OpaquePointer
    let socketPath: String
    let handlers: UnsafeMutablePointer<ssb_handlers>
    var peers: [String: Peer] = [:]
    /// How many senders ``peers`` holds at most; one more is refused LimitsExceeded.
    let maxSenders: Int
    /// How many senders of one process ``peers`` holds at most.
    let maxSendersPerProcess: Int
    /// The configuration (whether `plain` sessions are served).
    let settings: SecretServiceSettings
    /// When (clock ticks since boot, as `/proc/PID/stat` counts a start time) the front end saw each
    /// unique name appear on the bus (NameOwnerChanged), until the name leaves.
    private var appeared: [String: UInt64] = [:]
    /// Which sender each session object belongs to.
    var owners: [String: String] = [:]
    private var nextSession: UInt64 = 1
    /// Open prompts (object path → whose and for what) and the next prompt's number.
    var prompts: [String: PendingPrompt] = [:]
    var nextPrompt: UInt64 = 1
    /// Prompts that ended on their own threads, for the bus thread to complete.
    let completions = PromptCompletions()
    /// The keybag's lock state as the agent's events last told it (nil before the first).
    var watchedLockState: LockState?
    /// The sender a signal being built is addressed to: a property's value in it is that sender's.
    var emittingTo: String?
    /// The server's DH key pair for the next `dh-ietf1024-sha256-aes128-cbc-pkcs7` session, made on
    /// the loop's turn after the last one was taken, so that OpenSession does not wait for it; used
    /// for one session only, its private value wiped then (or when the front end goes).
    private var nextKeyPair: (privateValue: SecureBytes, publicValue: [UInt8])?
    /// The writes of agent connections no longer held (senders gone, connections remade), in all and
    /// by access group: with those of the peers', every change the front end made
    /// (``announceItemChanges()``).
    private var retiredWrites = 0
    /// The agent answered a query by several references errSecParam (an agent from before them):
    /// GetSecrets reads one item at a time.
    var severalReferencesRefused = false
    /// The agent answered NOTE_ACCESS errSecParam (an agent from before it): no more notes.
    var noteAccessRefused = false
    private var retiredWritesByGroup: [String: Int] = [:]
    /// The item-change events of the watch's current agent connection that ``announceItemChanges()``
    /// accounted for: its generation, the front end's writes when it began, and how many events
    /// were others' changes already announced.
    var itemWatch = ItemWatch(generation: 0, ownAtStart: OwnWrites())
    struct ItemWatch {
        let generation: Int
        let ownAtStart: OwnWrites
        var announcedByGroup: [String: Int] = [:]
        var announcedAnywhere = 0
    }

    /// The front end's own successful writes: in all, and by the access group each named.
    struct OwnWrites {
        var total = 0
        var byGroup: [String: Int] = [:]
    }
    /// The `session` collection: each identity's (default group's) items, by identifier.
    var sessionItems: [String: [String: SessionItem]] = [:]
    /// Record listings (a group's collections, its aliases) kept for the next caller of the group
    /// while ``recordsMark(group:)`` is unchanged: a client's first look at the service (its
    /// `Collections`) costs no agent round trip.
    var recordListings: [ListingKey: RecordListing] = [:]
    struct ListingKey: Hashable { let group: String, service: String }
    struct RecordListing { let records: [Attributes], mark: RecordsMark }
    struct RecordsMark: Equatable { let generation: Int, others: Int, anywhere: Int, recordWrites: Int }
    /// Record writes (a collection's or an alias's record, an item deletion) the front end started
    /// or ended: each moves the marks of record listings.
    var recordWrites = 0
    /// How many prompts one sender may hold at once.
    static let promptsPerSender = 16

    /// Why the front end cannot serve; ``exitStatus`` is the process's (documented in coffer-secret-service(1)).
    public enum StartError: Error, CustomStringConvertible {
        /// The session bus cannot be reached (exit 1).
        case bus(String)
        /// `org.freedesktop.secrets` has another owner: another front end, gnome-keyring, KeePassXC (exit 69).
        case nameTaken

        public var exitStatus: Int32 {
            switch self {
            case .bus: 1
            case .nameTaken: 69
            }
        }

        public var description: String {
            switch self {
            case .bus(let why): why
            case .nameTaken:
                "\(SecretServiceFrontEnd.busName) is already owned on this session bus (another coffer-secret-service, "
                    + "gnome-keyring or KeePassXC); not replacing it"
            }
        }
    }

    /// Connects to the session bus (DBUS_SESSION_BUS_ADDRESS), serves the Service object and owns
    /// `org.freedesktop.secrets`, neither replacing another owner nor queueing behind it.
    /// `socketPath`: the agent's native socket, as the CLI finds it.
    /// `maxSenders`: how many distinct senders are served at once (``defaultMaxSenders``), and
    /// `maxSendersPerProcess` how many of them one process may hold (``defaultMaxSendersPerProcess``).
    /// `settings`: the configuration file's (by default none: `plain` sessions refused).
    public init(socketPath: String, maxSenders: Int = SecretServiceFrontEnd.defaultMaxSenders,
                maxSendersPerProcess: Int = SecretServiceFrontEnd.defaultMaxSendersPerProcess,
                settings: SecretServiceSettings = SecretServiceSettings(source: SecretServiceSettings.defaultPath())) throws(StartError) {
        var bus: OpaquePointer?
        let r = ssb_bus_open_session(&bus)
        guard r >= 0, let bus else { throw .bus("cannot connect to the session bus: \(String(cString: strerror(-r)))") }
        self.bus = bus
        self.socketPath = socketPath
        self.maxSenders = max(1, maxSenders)
        self.maxSendersPerProcess = max(1, maxSendersPerProcess)
        self.settings = settings
        handlers = .allocate(capacity: 1)
        handlers.initialize(to: ssb_handlers(
            open_session: { m, userdata in SecretServiceFrontEnd.from(userdata).openSession(m) },
            close_session: { m, userdata in SecretServiceFrontEnd.from(userdata).closeSession(m) },
            name_owner_changed: { name, _, newOwner, userdata in
                guard let name, let newOwner else { return }
                SecretServiceFrontEnd.from(userdata).nameOwnerChanged(String(cString: name), newOwner: String(cString: newOwner))
            },
            method: { m, userdata in SecretServiceFrontEnd.from(userdata).method(m) },
            get_property: { call, path, interface, property, reply, error, userdata in
                SecretServiceFrontEnd.from(userdata).getProperty(call, path, interface, property, reply, error)
            },
            set_property: { call, path, interface, property, value, error, userdata in
                SecretServiceFrontEnd.from(userdata).setProperty(call, path, interface, property, value, error)
            },
            find: { path, interface, introspecting, userdata in
                guard let path, let interface else { return 0 }
                return SecretServiceFrontEnd.from(userdata).find(String(cString: path), interface: String(cString: interface),
                                                                 introspecting: introspecting != 0) ? 1 : 0
            },
            enumerate: { call, prefix, userdata in
                SecretServiceFrontEnd.from(userdata).enumerate(call, prefix: prefix.map { String(cString: $0) } ?? "")
            },
            userdata: nil))
        handlers.pointee.userdata = Unmanaged.passUnretained(self).toOpaque()
        // Served before the name is owned, so that no call to the name finds nothing.
        let served = ssb_bus_serve_service(bus, Self.servicePath, handlers)
        guard served >= 0 else { throw .bus("cannot serve \(Self.servicePath): \(String(cString: strerror(-served)))") }
        let objects = ssb_bus_serve_objects(bus, Self.collectionPrefix, Self.aliasPrefix, Self.promptPrefix, Self.referencePrefix,
                                            String(Self.sessionPathPrefix.dropLast()), handlers)
        guard objects >= 0 else { throw .bus("cannot serve collections and items: \(String(cString: strerror(-objects)))") }
        startLockWatch()
        switch ssb_request_name(bus, Self.busName) {
        case SSB_NAME_OWNED: break
        case SSB_NAME_TAKEN: throw .nameTaken
        case let e: throw .bus("cannot own \(Self.busName): \(String(cString: strerror(-e)))")
        }
    }

    deinit {
        for peer in peers.values { for s in peer.sessions.values { ssb_slot_release(s.slot) } }
        for items in sessionItems.values { for i in items.values { i.secret.wipe() } }
        nextKeyPair?.privateValue.wipe()
        ssb_bus_close(bus)
        handlers.deallocate()
    }

    /// Serves until the bus connection ends (0) or fails (a negative errno). Prompts that end on
    /// their threads are completed here, on the bus thread (``completions``' eventfd wakes the loop).
    public func run() -> Int32 {
        makeKeyPair()
        return ssb_bus_run(bus, completions.wake, { userdata in
            let frontEnd = SecretServiceFrontEnd.from(userdata)
            frontEnd.completePrompts()
            frontEnd.announceLockState()
            frontEnd.announceItemChanges()
            frontEnd.makeKeyPair()
            // Nothing waits on a timer: what a prompt allowed is the agent's grant.
            return -1
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Watches the keybag's lock state and the items on a thread of its own: the front end's own agent
    /// connection, subscribed to the agent's lock events and item changes (WireProtocol.md, Events),
    /// hands each state, and that items changed, to the bus thread, which announces the collections'
    /// `Locked` (so a client's cached value follows a lock made anywhere: `coffer lock`, the idle
    /// lock, the session's lock) and their changes (``announceItemChanges()``). After the agent goes
    /// away (a restart) it connects again a second later and starts from the agent's status. An agent
    /// that refuses item changes (older than them) is watched for lock events alone.
    ///
    /// Started before the name is owned, and its first connection made (or failed) before this
    /// returns, so the front end's descriptors are settled and item changes are heard when clients
    /// come. A running agent answers at once; a slow one is waited for as long as any reply
    /// (``agentReplyTimeout``), not cut short on a loaded machine (the name is not owned meanwhile,
    /// and an activated client's call waits for it).
    func startLockWatch() {
        let socketPath = socketPath, completions = completions
        let firstAttempt = Protected(false)
        let started = Threads.detach {
            while true {
                do throws(SecError) {
                    defer { firstAttempt.withLock { $0 = true }; firstAttempt.broadcast() }
                    let agent = try AgentConnection(path: socketPath, clientName: "coffer-secret-service",
                                                    replyTimeout: SecretServiceFrontEnd.agentReplyTimeout)
                    do throws(SecError) {
                        do throws(SecError) {
                            try agent.subscribe(to: [.lock, .items, .itemGroups])
                            completions.itemWatchStarted(namesGroups: true)
                        } catch where error.status == .param {
                            // An agent whose events never name groups (-50: the connection stays open).
                            try agent.subscribe(to: [.lock, .items])
                            completions.itemWatchStarted(namesGroups: false)
                        }
                    } catch where error.status == .param || error.status == .missingEntitlement {
                        // An older agent (-50, an unknown message: the connection stays open) or a
                        // front end run without its manifest (-34018): lock events only, on this
                        // connection (the next one tries again).
                        try agent.subscribe()
                    }
                    completions.post(lockState: try agent.status().lockState)
                    completions.watching(agent)
                    firstAttempt.withLock { $0 = true }
                    firstAttempt.broadcast()
                    agent.setReplyTimeout(0)
                    while true {
                        // Busy from before the event leaves the socket until it is posted (``PromptCompletions/watchIsBehind``).
                        let event = try agent.nextEvent(beforeReading: { completions.readingEvent() })
                        switch event {
                        case .locked: completions.post(lockState: .locked)
                        case .unlocked: completions.post(lockState: .unlocked)
                        case .itemsChanged(let groups): completions.postItemsChanged(groups: groups)
                        case .willLock: break
                        }
                        completions.eventHandled()
                    }
                } catch {
                    completions.watching(nil)
                    completions.itemWatchEnded()
                    sleep(1)
                }
            }
        }
        if started { _ = firstAttempt.withLock(waitingUntil: { $0 }, timeout: Self.agentReplyTimeout) { _ in } }
    }

    /// On the bus thread: a changed lock state is announced to each sender as PropertiesChanged of
    /// `Locked` on every persistent collection it was shown and on the `default` alias.
    func announceLockState() {
        guard let state = completions.takeLockState() else { return }
        let was = watchedLockState
        watchedLockState = state
        // Boot and locked are both locked to a client; the first state known is no change.
        guard let was, (was == .unlocked) != (state == .unlocked) else { return }
        for c in callers {
            for name in c.peer.shown.sorted() {
                propertiesChanged(to: c, Self.collectionPath(name), Self.collectionInterface, ["Locked"])
            }
            propertiesChanged(to: c, Self.aliasPrefix + "/default", Self.collectionInterface, ["Locked"])
            guard state == .unlocked else { continue }
            // The items it was shown locked are readable now: their values, as a GetAll would give them.
            let items = c.peer.lockedShown.sorted()
            c.peer.lockedShown = []
            for path in items {
                propertiesChanged(to: c, path, Self.itemInterface, ["Locked", "Attributes", "Label", "Type", "Created", "Modified"])
            }
        }
    }

    /// How many items shown locked are remembered per sender to announce at the unlock.
    static let maxLockedShown = 256

    /// On the bus thread: items changed outside the front end are announced to each sender that sees
    /// their access group, as the service's `CollectionChanged` and an invalidated `Items` of every
    /// persistent collection of that group it was shown, and of the `default` alias when the group is
    /// its default one, so a client that lists a collection's items looks again. The agent says in
    /// which groups items changed, never which items, and sends one event for every successful
    /// write, the front end's own included (WireProtocol.md, Events); the front end signals its own
    /// changes itself (ItemCreated …), and each of its writes names its group, so a group's events
    /// beyond the count of the front end's writes there are others' changes. An own write's event may
    /// come after a later change of someone else's: that change is then announced when the event
    /// comes. Several changes since the last turn of the loop are one announcement. An event that
    /// names no group (a sync, a restore; every event of an agent that never names them, less the
    /// front end's own writes) is announced to every sender; so is the watch connecting again (the
    /// agent restarted: changes may have been missed).
    func announceItemChanges() {
        guard let (generation, heard) = completions.takeItemEvents() else { return }
        let own = ownWritesByGroup()
        var everywhere = false
        if generation != itemWatch.generation {
            everywhere = itemWatch.generation != 0
            itemWatch = ItemWatch(generation: generation, ownAtStart: own)
        }
        // Without groups in the events, the front end's own writes are among those naming none.
        let ownAnywhere = heard.namesGroups ? 0 : own.total - itemWatch.ownAtStart.total
        if heard.anywhere - ownAnywhere > itemWatch.announcedAnywhere {
            itemWatch.announcedAnywhere = heard.anywhere - ownAnywhere
            everywhere = true
        }
        var groups = Set<String>()
        for (group, count) in heard.byGroup {
            let others = count - ((own.byGroup[group] ?? 0) - (itemWatch.ownAtStart.byGroup[group] ?? 0))
            guard others > itemWatch.announcedByGroup[group, default: 0] else { continue }
            itemWatch.announcedByGroup[group] = others
            groups.insert(group)
        }
        guard everywhere || !groups.isEmpty else { return }
        for c in callers {
            let changed = { (group: String) in everywhere || groups.contains(group) }
            for name in c.peer.shown.sorted() where changed(c.location(name).group) {
                emit(to: c, Self.servicePath, Self.serviceInterface, "CollectionChanged", Self.collectionPath(name))
                propertiesChanged(to: c, Self.collectionPath(name), Self.collectionInterface, ["Items"])
            }
            if changed(c.group) { propertiesChanged(to: c, Self.aliasPrefix + "/default", Self.collectionInterface, ["Items"]) }
        }
    }

    /// Makes ``nextKeyPair`` if it was taken (a failure leaves it to OpenSession, which makes its own).
    private func makeKeyPair() {
        if nextKeyPair == nil { nextKeyPair = try? DHKeyPair.generate() }
    }

    static func from(_ userdata: UnsafeMutableRawPointer?) -> SecretServiceFrontEnd {
        Unmanaged<SecretServiceFrontEnd>.fromOpaque(userdata!).takeUnretainedValue()
    }

    // MARK: Errors on the bus

    /// A D-Bus error answer: its name and a message for people (never a secret).
    package struct BusError: Error {
        package let name: String
        package let message: String
        static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
        static let failed = "org.freedesktop.DBus.Error.Failed"
        static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"
        static let limitsExceeded = "org.freedesktop.DBus.Error.LimitsExceeded"
        static let noSession = "org.freedesktop.Secret.Error.NoSession"
        static let noSuchObject = "org.freedesktop.Secret.Error.NoSuchObject"
        static let isLocked = "org.freedesktop.Secret.Error.IsLocked"
        static let notSupported = "org.freedesktop.DBus.Error.NotSupported"
    }

    func reply(_ m: OpaquePointer?, _ e: BusError) -> Int32 { ssb_reply_error(m, e.name, e.message) }

    // MARK: Delegated identity

    /// The sender's peer, made on its first call: its pid from the bus (GetConnectionCredentials), its
    /// start time read right away, its pidfd (the bus's ProcessFD where it offers one, else
    /// pidfd_open of the pid), a new agent connection, and DELEGATE before anything else on it. A
    /// peer whose agent connection the agent closed (it restarted) gets a new one the same way, its
    /// sessions kept. At most ``maxSenders`` senders are held: one more is refused LimitsExceeded.
    func peer(for sender: String) throws(BusError) -> Peer {
        if let p = peers[sender] {
            guard p.agent.isHungUp else { return p }
            let fresh = try connect(sender)
            retire(p.agent) // counted once, when the old connection is let go
            (p.agent, p.groups, p.process) = fresh
            return p
        }
        guard peers.count < maxSenders else {
            throw BusError(name: BusError.limitsExceeded,
                           message: "the front end already serves \(maxSenders) senders; \(sender) is refused until one leaves the bus")
        }
        let (agent, groups, process) = try connect(sender)
        let p = Peer(agent: agent, groups: groups, process: process)
        peers[sender] = p
        return p
    }

    /// Clock ticks since boot now, as `/proc/PID/stat` field 22 counts a process's start.
    package static func ticksSinceBoot() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_BOOTTIME, &ts)
        let hz = UInt64(max(1, sysconf(Int32(_SC_CLK_TCK))))
        return UInt64(ts.tv_sec) * hz + UInt64(ts.tv_nsec) * hz / 1_000_000_000
    }

    /// A new agent connection delegated to `sender`'s process, and the access groups the agent gives it.
    private func connect(_ sender: String) throws(BusError) -> (AgentConnection, [String], DelegatedProcess) {
        var pid: UInt32 = 0
        var busPIDFD: Int32 = -1
        let r = ssb_connection_credentials(bus, sender, &pid, &busPIDFD)
        guard r >= 0, pid > 0, pid <= UInt32(Int32.max) else {
            if busPIDFD >= 0 { close(busPIDFD) }
            throw BusError(name: BusError.accessDenied, message: "the bus does not say which process \(sender) is")
        }
        // One process's senders are limited below the front end's: a script opening connections in a
        // loop is refused here, not every other process at ``maxSenders``.
        guard peers.values.lazy.filter({ $0.process.pid == Int32(pid) }).count < maxSendersPerProcess else {
            if busPIDFD >= 0 { close(busPIDFD) }
            throw BusError(name: BusError.limitsExceeded,
                           message: "process \(pid) already has \(maxSendersPerProcess) bus connections served (the most one process may hold); "
                               + "close one to be served again")
        }
        let process = try Self.senderProcess(sender, pid: Int32(pid), busPIDFD: busPIDFD, appeared: appeared[sender])
        let (startTime, pidfd) = (process.startTime, process.pidfd)
        // The bus waits while this runs (one thread): a stuck agent fails the call after the timeout
        // instead of stopping the front end. HELLO goes out with DELEGATE (its answer is read first).
        let agent: AgentConnection
        do {
            agent = try AgentConnection(path: socketPath, clientName: "coffer-secret-service", pipelineHello: true,
                                        replyTimeout: Self.agentReplyTimeout)
        } catch {
            throw BusError(name: BusError.failed, message: "the Coffer agent is not reachable: \(error.message)")
        }
        // The groups the agent gives the delegated process (WHOAMI right behind DELEGATE, one round
        // trip): the first is where its collections live.
        let groups: [String]
        do { groups = try agent.delegateAndIdentify(pidfd: pidfd, pid: Int32(pid), startTime: startTime).accessGroups } catch {
            throw BusError(name: BusError.accessDenied, message: "the Coffer agent refused to act for \(sender): \(error.message)")
        }
        guard !groups.isEmpty else {
            throw BusError(name: BusError.accessDenied, message: "the Coffer agent gives \(sender) no access group")
        }
        return (agent, groups, process)
    }

    /// The process `pid` the bus named for `sender` (with its ProcessFD `busPIDFD`, owned, or -1), pinned
    /// and described for DELEGATE: its start time read first, then its pidfd. `appeared`: when the
    /// front end saw `sender`'s unique name appear (``ticksSinceBoot()``), nil if before it started.
    /// AccessDenied for a process that is gone, or that started after the name appeared (a newcomer
    /// holding a reused pid, never the sender).
    package static func senderProcess(_ sender: String, pid: Int32, busPIDFD: Int32, appeared: UInt64?) throws(BusError) -> DelegatedProcess {
        // The start time first, then pidfd_open (the threat model's order): the agent re-reads the
        // start time through the pidfd, so a pid reused in between is refused, not served.
        guard let startTime = ProcessStat.of(pid: pid)?.startTime else {
            if busPIDFD >= 0 { close(busPIDFD) }
            throw BusError(name: BusError.accessDenied, message: "process \(pid) of \(sender) is gone")
        }
        // The threat model's SHOULD: the process that connected started before its unique name
        // appeared, and a pid is reused only after its first holder exited, so a process started
        // later is a newcomer holding a reused pid, never the sender.
        if let appeared, startTime > appeared {
            if busPIDFD >= 0 { close(busPIDFD) }
            throw BusError(name: BusError.accessDenied,
                           message: "process \(pid) started after \(sender) appeared on the bus: it is not the sender (a reused pid)")
        }
        let pidfd: Int32
        if busPIDFD >= 0 {
            pidfd = busPIDFD
        } else {
            do { pidfd = try ProcessHandle.pidfd(of: pid).release() } catch {
                throw BusError(name: BusError.accessDenied, message: "process \(pid) of \(sender) is gone")
            }
        }
        return DelegatedProcess(pidfd: pidfd, pid: pid, startTime: startTime)
    }

    /// A unique name appeared (its time is kept) or a sender left the bus: its agent connection
    /// closes and its sessions go.
    private func nameOwnerChanged(_ name: String, newOwner: String) {
        guard name.hasPrefix(":") else { return }
        guard newOwner.isEmpty else {
            appeared[name] = Self.ticksSinceBoot()
            return
        }
        appeared[name] = nil
        guard let p = peers.removeValue(forKey: name) else { return }
        retire(p.agent)
        for (path, s) in p.sessions {
            ssb_slot_release(s.slot)
            owners[path] = nil
        }
        // Its running prompts are cancelled: their agent connections close, and so does the pinentry.
        for (path, prompt) in prompts where prompt.sender == name {
            prompt.work?.cancel()
            prompts[path] = nil
        }
    }

    // MARK: Service.OpenSession and Session.Close

    private func openSession(_ m: OpaquePointer?) -> Int32 {
        guard let senderC = ssb_message_sender(m) else { return reply(m, BusError(name: BusError.failed, message: "no sender")) }
        let sender = String(cString: senderC)
        var algorithmC: UnsafePointer<CChar>?
        var kind: Int32 = 0
        var input: UnsafeRawPointer?
        var size = 0
        guard ssb_read_open_session(m, &algorithmC, &kind, &input, &size) >= 0, let algorithmC else {
            return reply(m, BusError(name: BusError.invalidArgs, message: "OpenSession takes (s algorithm, v input)"))
        }
        let algorithm = String(cString: algorithmC)
        let inputBytes = kind == SSB_INPUT_BYTES && size > 0 ? [UInt8](UnsafeRawBufferPointer(start: input, count: size)) : []
        do throws(BusError) {
            // Before the sender is served at all: a client that falls back from plain finds out at once.
            if algorithm == SecretServiceAlgorithm.plain.rawValue, !settings.allowsPlainSessions { throw Self.plainRefused(settings) }
            let peer = try peer(for: sender)
            guard peer.sessions.count < Self.sessionsPerSender else {
                throw BusError(name: BusError.limitsExceeded,
                               message: "\(sender) already holds \(Self.sessionsPerSender) sessions: close one first")
            }
            let opened: (output: [UInt8], session: SecretServiceSession)
            do {
                if case .dhIETF1024SHA256AES128CBCPKCS7 = try SecretServiceAlgorithm.named(algorithm), kind != SSB_INPUT_BYTES {
                    throw BusError(name: BusError.invalidArgs, message: "the \(algorithm) session's input is a byte array (ay)")
                }
                if algorithm == SecretServiceAlgorithm.dhIETF1024SHA256AES128CBCPKCS7.rawValue, let pair = nextKeyPair {
                    nextKeyPair = nil
                    if completions.wake >= 0 { ssb_wake(completions.wake) } // the loop's next turn makes the next pair
                    opened = try SecretServiceSession.open(algorithm: algorithm, input: inputBytes, keyPair: pair)
                } else {
                    opened = try SecretServiceSession.open(algorithm: algorithm, input: inputBytes)
                }
            } catch let e as SecretServiceSessionError {
                throw BusError(name: e.dbusErrorName, message: e.description)
            } catch let e as BusError {
                throw e
            } catch {
                throw BusError(name: BusError.failed, message: "\(error)")
            }
            let path = Self.sessionPathPrefix + String(nextSession)
            nextSession += 1
            var slot: OpaquePointer?
            let added = ssb_add_session(bus, path, handlers, &slot)
            guard added >= 0, let slot else {
                throw BusError(name: BusError.failed, message: "cannot serve \(path): \(String(cString: strerror(-added)))")
            }
            peer.sessions[path] = OpenSession(session: opened.session, slot: slot)
            owners[path] = sender
            let asBytes: Int32 = opened.session.algorithm == .plain ? 0 : 1
            return opened.output.withUnsafeBytes { ssb_reply_open_session(m, asBytes, $0.baseAddress, $0.count, path) }
        } catch {
            return reply(m, error)
        }
    }

    /// The refusal of a `plain` session (the spec's error for an algorithm the service does not
    /// support), naming the setting that allows it and the file it goes in.
    static func plainRefused(_ settings: SecretServiceSettings) -> BusError {
        BusError(name: BusError.notSupported,
                 message: "plain sessions are refused: their secrets would cross the session bus unencrypted, readable by any client "
                    + "that monitors the bus (dbus-monitor). Use dh-ietf1024-sha256-aes128-cbc-pkcs7 (libsecret, secretstorage and "
                    + "Chromium do), or allow plain sessions with '\(SecretServiceSettings.plainSessionsKey) = allow' in \(settings.source)")
    }

    private func closeSession(_ m: OpaquePointer?) -> Int32 {
        guard let senderC = ssb_message_sender(m), let pathC = ssb_message_path(m) else {
            return reply(m, BusError(name: BusError.failed, message: "no sender"))
        }
        let sender = String(cString: senderC), path = String(cString: pathC)
        guard owners[path] == sender, let peer = peers[sender], let s = peer.sessions.removeValue(forKey: path) else {
            // A session that was never opened, is closed, or is another sender's does not exist for
            // this caller: NoSuchObject, as for every other object (the fallback on the session prefix
            // brings every such call here).
            return reply(m, BusError(name: BusError.noSuchObject, message: "\(path) is not a session of \(sender)"))
        }
        owners[path] = nil
        let r = ssb_reply_empty(m)
        // The object goes after the reply; sd-bus holds the slot until this call returns.
        ssb_slot_release(s.slot)
        return r
    }
}

// MARK: GetSecrets of a search's items in one agent query

extension SecretServiceFrontEnd {
    /// What the front end knows of changes now (its own writes, the agent's told changes, the lock
    /// states posted), to take before a search: nil while no watch of item changes runs (nothing would
    /// tell of others').
    func changeMark() -> ChangeMark? {
        completions.itemWatchMark.map { ChangeMark(writes: ownWrites(), generation: $0.generation, changes: $0.count,
                                                   lockPosts: completions.lockPosts) }
    }

    /// ``changeMark()``'s value: the front end's own writes, the watch's connection and count of
    /// told changes, and the count of lock states posted (the agent's answer of which matches are
    /// locked holds until the keybag locks or unlocks).
    struct ChangeMark: Equatable {
        let writes: Int, generation: Int, changes: Int, lockPosts: UInt64
    }

    /// Remembers the keychain items a Service.SearchItems gave the sender (``Peer/lastSearch``);
    /// `mark`: ``changeMark()`` taken before the search.
    func rememberSearch(_ c: Caller, attributes: Attributes, found: [Record], mark: ChangeMark?) {
        let kept = found.filter { $0.collection != Self.sessionCollection }
        var byRef: [[UInt8]: Record] = [:]
        var refByPath: [String: [UInt8]] = [:]
        for r in kept {
            guard let ref = r.ref else { continue }
            byRef[ref] = r
            refByPath[r.path] = ref
        }
        c.peer.lastSearch = LastSearch(attributes: attributes, byRef: byRef, refByPath: refByPath, mark: mark)
    }

    /// Every successful write the front end's agent connections made.
    func ownWrites() -> Int { retiredWrites + peers.values.reduce(0) { $0 + $1.agent.writes } }

    /// ``ownWrites()``, in all and by access group.
    func ownWritesByGroup() -> OwnWrites {
        var own = OwnWrites(total: ownWrites(), byGroup: retiredWritesByGroup)
        for p in peers.values { own.byGroup.merge(p.agent.writesByGroup, uniquingKeysWith: +) }
        return own
    }

    /// Keeps the count of writes of an agent connection let go.
    func retire(_ agent: AgentConnection) {
        retiredWrites += agent.writes
        retiredWritesByGroup.merge(agent.writesByGroup, uniquingKeysWith: +)
    }

    /// The secrets of those of `paths` that agent queries by reference give (an item read by its
    /// reference costs no index search): every item whose persistent
    /// reference the front end knows (a reference path names it; the sender's last search found a
    /// collection's item), read together by their references (WireProtocol.md: a query naming several
    /// references, at most ``ItemQuery/maximumPersistentRefs`` a query, so one query for up to that
    /// many items and one more for each such number beyond), each answered with the record the search found while nothing changed since it,
    /// else with one made from its attributes as they are now (its content type included). An item whose path is no longer the one asked for (changed or gone
    /// since the search), and anything a query does not give (a locked or access-controlled item,
    /// which fails the whole query it is in; an agent from before queries by several references; any error),
    /// is left to the per-item path, which answers exactly as before. Secrets not kept are wiped at once.
    func batchSecrets(_ c: Caller, _ paths: [String]) -> [String: (Record, SecureBytes)] {
        guard !severalReferencesRefused else { return [:] }
        let searched = c.peer.lastSearch?.refByPath ?? [:]
        var asked: [[UInt8]: String] = [:]
        for path in paths {
            if case .reference(let ref)? = Self.parse(path) {
                asked[ref] = asked[ref] ?? path
            } else if let ref = searched[path] {
                asked[ref] = asked[ref] ?? path
            }
        }
        guard !asked.isEmpty else { return [:] }
        // The search's records stand for the items while nothing changed since it (as far as the
        // front end knows: ``changeMark()``): then only secrets and references come back, else the
        // attributes too, and each record is made afresh.
        let searchedRecords = c.peer.lastSearch.flatMap { last in
            last.mark != nil && last.mark == changeMark() && asked.keys.allSatisfy { last.byRef[$0] != nil } ? last.byRef : nil
        }
        // One query names at most ``ItemQuery/maximumPersistentRefs`` references: more items are read
        // in as many queries as that takes (1,000 items in 4), never one by one.
        let refs = Array(asked.keys)
        var query = itemQuery(c, returnData: true)
        query.returnAttributes = searchedRecords == nil
        query.reportsAccessState = false
        query.returnPersistentRef = true
        query.limit = .all
        var results: [ItemResult] = []
        for start in stride(from: 0, to: refs.count, by: ItemQuery.maximumPersistentRefs) {
            query.persistentRef = refs[start..<min(start + ItemQuery.maximumPersistentRefs, refs.count)].flatMap { $0 }
            do {
                results += try c.agent.copyMatching(query)
            } catch where error.status == .param {
                // An agent from before several references answers errSecParam: one item at a time, from now on.
                results.forEach { $0.data?.wipe() }
                severalReferencesRefused = true
                return [:]
            } catch {
                continue // this query's items are left to the per-item path
            }
        }
        var out: [String: (Record, SecureBytes)] = [:]
        for r in results {
            guard let data = r.data else { continue }
            guard let ref = r.persistentRef, let path = asked[ref], out[path] == nil,
                  var record = searchedRecords.map({ $0[ref] }) ?? Record(r, for: c) else {
                data.wipe()
                continue
            }
            record.ref = ref
            if case .reference? = Self.parse(path) {
                record.alias = path
            } else if record.path != path {
                data.wipe()
                continue
            }
            out[path] = (record, data)
        }
        return out
    }
}

// MARK: The session collection in the audit log

extension SecretServiceFrontEnd {
    /// Tells the agent what the sender did with an item of the `session` collection (held here, in
    /// memory, never in the keychain), so that the audit log has it under the sender's identity as it
    /// has every keychain item's: NOTE_ACCESS on the sender's delegated connection (WireProtocol.md,
    /// Delegated identity, "Items a front end holds"). Best effort, as the agent's own audit: a note
    /// that cannot be sent does not refuse the access; an agent from before NOTE_ACCESS gets no more.
    func noteSessionAccess(_ c: Caller, _ access: NotedAccess, count: Int = 1) {
        for _ in 0..<count where !noteAccessRefused {
            do {
                try c.agent.noteAccess(access)
            } catch where error.status == .param {
                noteAccessRefused = true
            } catch {
                return
            }
        }
    }
}

