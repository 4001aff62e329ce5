import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// The org.freedesktop.Secret.Prompt objects, and their work off the bus thread.
extension SecretServiceFrontEnd {
    // MARK: Prompts

    /// A prompt for objects that are locked: what it would unlock, whose it is, and its work once
    /// *Prompt* started it.
    struct PendingPrompt {
        let sender: String
        let objects: [String]
        /// The items with an access control among `objects` (path → the query reading its secret),
        /// and those of them that may have none (locked when asked: looked at after unlocking).
        var reads: [String: ItemQuery] = [:]
        var probes: Set<String> = []
        /// The keybag was unlocked when the prompt was made: its work reads first, and unlocks only
        /// if the keybag has locked since (one round trip fewer for the usual protected read).
        var keybagUnlocked = false
        var work: PromptWork? = nil
    }

    /// A Prompt object for `objects`, the caller's (at most ``promptsPerSender`` at once); `reads`:
    /// the items with an access control among them, whose secrets the prompt reads (`probes`: those
    /// read only if they turn out to have one).
    func newPrompt(_ c: Caller, unlocking objects: [String], reading reads: [String: ItemQuery] = [:],
                   probing probes: Set<String> = [], keybagUnlocked: Bool = false) throws(BusError) -> String {
        guard prompts.values.count(where: { $0.sender == c.sender }) < Self.promptsPerSender else {
            throw BusError(name: BusError.limitsExceeded, message: "\(c.sender) already holds \(Self.promptsPerSender) prompts")
        }
        let path = Self.promptPrefix + "/p" + String(nextPrompt)
        nextPrompt += 1
        prompts[path] = PendingPrompt(sender: c.sender, objects: objects, reads: reads, probes: probes, keybagUnlocked: keybagUnlocked)
        return path
    }

    /// Prompt(window-id) returns at once. On a thread of its own, a new agent connection is delegated
    /// to the sender's process and sends PROMPT_UNLOCK, then PROMPT_READ for each item with an access
    /// control: the agent asks the person with its own prompter, naming the app as it identified the
    /// sender, and grants the items to the sender's process (CallerSessions: its GetSecret then reads
    /// them as any read, and no secret waits in the front end). *Completed* follows on the bus thread:
    /// (false, the objects) once unlocked and granted,
    /// (true, []) when the person cancelled, nobody could be asked (the agent has no pinentry or knows
    /// no display of the person's session: at once) or the agent refused. Whether a dialog can appear is
    /// the agent's to decide, from the person's session (issue #43), never from the sender's
    /// environment: Chromium rewrites its own, a non-dumpable process hides it, and any process of the
    /// user can set one. Meanwhile every other call is served; a sender has one
    /// prompt running at a time.
    func prompt(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        guard var p = prompts[path], p.sender == c.sender else { throw BusError(name: BusError.noSuchObject, message: "no prompt \(path)") }
        guard p.work == nil else { return ssb_reply_empty(m) }
        // One running prompt per sender: a person is asked one thing at a time. Prompts whose
        // threads have just ended are completed first, so a finished one never counts.
        completePrompts()
        if let running = prompts.first(where: { $0.key != path && $0.value.sender == c.sender && $0.value.work != nil })?.key {
            throw BusError(name: BusError.limitsExceeded,
                           message: "\(c.sender) already has a running prompt (\(running)): dismiss it or wait for its Completed first")
        }
        let rc = ssb_reply_empty(m)
        let work = PromptWork(path: path, process: c.peer.process, socketPath: socketPath, reads: p.reads, probes: p.probes,
                              unlockFirst: !p.keybagUnlocked || p.reads.isEmpty || !p.probes.isEmpty,
                              completions: completions)
        p.work = work
        prompts[path] = p
        // Without a wake descriptor the bus thread would never learn the end: dismissed at once.
        if completions.wake < 0 || !work.start() { complete(path, unlocked: false) }
        return rc
    }

    /// Dismiss: the prompt's agent connection closes (the agent's pinentry with it) and
    /// *Completed(true, [])* follows.
    func dismiss(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        guard let p = prompts[path], p.sender == c.sender else { throw BusError(name: BusError.noSuchObject, message: "no prompt \(path)") }
        p.work?.cancel()
        let rc = ssb_reply_empty(m)
        complete(path, unlocked: false)
        return rc
    }

    /// The prompt at `path` ends (nothing if it already has): Completed on the bus. What its reads
    /// allowed is the agent's grant to the sender's process (CallerSessions): the front end keeps nothing.
    func complete(_ path: String, unlocked: Bool) {
        guard let p = prompts.removeValue(forKey: path) else { return }
        guard unlocked else {
            _ = ssb_emit_completed(bus, p.sender, path, 1, nil, 0)
            return
        }
        let cs: [UnsafePointer<CChar>?] = p.objects.map { UnsafePointer(strdup($0)) }
        defer { cs.forEach { free(UnsafeMutablePointer(mutating: $0)) } }
        _ = cs.withUnsafeBufferPointer { ssb_emit_completed(bus, p.sender, path, 0, $0.baseAddress, p.objects.count) }
    }

    /// On the bus thread: the prompts whose threads have ended.
    func completePrompts() {
        for e in completions.take() { complete(e.path, unlocked: e.unlocked) }
    }
}

/// What other threads hand the bus thread, an eventfd waking its loop: prompts that ended on their
/// threads, that items changed, and the keybag's lock state as the agent's events tell it (``SecretServiceFrontEnd/startLockWatch()``).
final class PromptCompletions: Sendable {
    /// The lock state: the one to announce (taken by the bus thread), the latest known, how many
    /// the watch has posted (an event or its first STATUS), and how many posts there were in all
    /// (the watch's and the inferred ones: ``lockPosts``).
    private let lockState = Protected<(posted: LockState?, latest: LockState?, events: UInt64, posts: UInt64)>((nil, nil, 0, 0))

    /// The watch's post: what the agent said.
    func post(lockState state: LockState) {
        lockState.withLock { s in
            s.posted = state
            s.latest = state
            s.events &+= 1
            s.posts &+= 1
        }
        if wake >= 0 { ssb_wake(wake) }
    }

    /// How many states the watch has posted so far (for ``post(inferred:ifNoEventSince:)``).
    var eventCount: UInt64 { lockState.withLock { $0.events } }

    /// How many lock states were posted so far, the watch's and the inferred ones: a search's answer
    /// of which items are locked stands while this is unchanged (``SecretServiceFrontEnd/changeMark()``).
    var lockPosts: UInt64 { lockState.withLock { $0.posts } }

    /// A state the front end knows from a request of its own (its Lock, a prompt's unlock), posted only
    /// if the watch has posted nothing since `count` was read before that request: an event since is
    /// newer than the inference (a lock right after the prompt's unlock), and wins.
    func post(inferred state: LockState, ifNoEventSince count: UInt64) {
        let posted = lockState.withLock { s -> Bool in
            guard s.events == count else { return false }
            s.posted = state
            s.latest = state
            s.posts &+= 1
            return true
        }
        if posted && wake >= 0 { ssb_wake(wake) }
    }

    /// The lock state last posted (nil: none yet), whether or not the bus thread has announced it:
    /// what a call asking for lock state is answered from, unless the watch's connection holds an
    /// event not yet read (``watchIsBehind``).
    var current: LockState? { lockState.withLock { $0.latest } }

    /// The watch's agent connection, while it is subscribed (nil otherwise).
    private let watch = Protected<AgentConnection?>(nil)
    /// The watch is taking an event off its connection and has not posted it yet (``readingEvent()``).
    private let reading = Protected(false)

    func watching(_ connection: AgentConnection?) {
        watch.withLock { $0 = connection }
        reading.withLock { $0 = false }
    }

    /// The watch is about to read an event that has arrived: ``watchIsBehind`` until it has posted it
    /// (``eventHandled()``).
    func readingEvent() { reading.withLock { $0 = true } }

    /// The watch posted the event it read.
    func eventHandled() { reading.withLock { $0 = false } }

    /// True when no watch is subscribed, or an event waits unread on its connection or is being read:
    /// the agent sends a lock event before it answers the request that locked or unlocked, so a state
    /// posted before it may be stale, and the caller asks the agent instead. Ask this before reading
    /// what was posted (``current``, the change mark): the bytes are looked at first, then whether
    /// the watch is reading them (it says so before it takes them and stops saying so after it posts),
    /// so an event that arrived before this call is waiting, being read, or already posted.
    var watchIsBehind: Bool {
        if watch.withLock({ $0?.hasUnreadBytes ?? true }) { return true }
        return reading.withLock { $0 }
    }

    /// The latest lock state posted since the last call, if any.
    func takeLockState() -> LockState? { lockState.withLock { s in defer { s.posted = nil }; return s.posted } }

    /// The item-change events of the watch's agent connection: which connection (a generation),
    /// whether its events name their access groups, how many events it brought (``HeardChanges``),
    /// whether any came since the bus thread last looked, and whether it is still subscribed (`live`).
    private let itemEvents = Protected((generation: 0, heard: HeardChanges(namesGroups: false), fresh: false, live: false))

    /// The item changes one watch connection heard: every event, those naming each access group, and
    /// those naming none (any group may have changed: a sync, a restore, or an agent whose events
    /// never name groups).
    struct HeardChanges {
        let namesGroups: Bool
        var count = 0
        var byGroup: [String: Int] = [:]
        var anywhere = 0
    }

    /// The watch subscribed to item changes on a new agent connection (`namesGroups`: with their groups).
    func itemWatchStarted(namesGroups: Bool) {
        itemEvents.withLock { $0 = ($0.generation + 1, HeardChanges(namesGroups: namesGroups), true, true) }
        if wake >= 0 { ssb_wake(wake) }
    }

    /// The watch's agent connection ended (or never subscribed to item changes): changes go untold.
    func itemWatchEnded() { itemEvents.withLock { $0.live = false } }

    /// The agent said items changed, in `groups` (nil: any group may have).
    func postItemsChanged(groups: [String]?) {
        itemEvents.withLock { e in
            e.heard.count += 1
            if let groups { for g in groups { e.heard.byGroup[g, default: 0] += 1 } } else { e.heard.anywhere += 1 }
            e.fresh = true
        }
        if wake >= 0 { ssb_wake(wake) }
    }

    /// The watch's generation and what it heard, if anything came since the last call.
    func takeItemEvents() -> (generation: Int, heard: HeardChanges)? {
        itemEvents.withLock { e in
            guard e.fresh else { return nil }
            e.fresh = false
            return (e.generation, e.heard)
        }
    }

    /// The watch's generation and event count while a watch of item changes runs, nil while none
    /// does: equal values at two moments mean the agent told of no change in between.
    var itemWatchMark: (generation: Int, count: Int)? { itemEvents.withLock { $0.live ? ($0.generation, $0.heard.count) : nil } }

    /// The watch's generation and everything it heard, while a watch of item changes that names
    /// groups runs (nil otherwise); nothing is taken (``takeItemEvents()`` still reports it).
    var heardSoFar: (generation: Int, heard: HeardChanges)? {
        itemEvents.withLock { $0.live && $0.heard.namesGroups ? ($0.generation, $0.heard) : nil }
    }

    /// A prompt that ended: whether it was granted, and the secrets it read (item path → secret).
    typealias Ended = (path: String, unlocked: Bool)
    /// The eventfd (-1 if none could be made: every prompt then completes dismissed at once).
    let wake: Int32 = max(-1, ssb_wake_fd_open())
    private let ended = Protected<[Ended]>([])

    func post(_ path: String, unlocked: Bool) {
        ended.withLock { $0.append((path, unlocked)) }
        if wake >= 0 { ssb_wake(wake) }
    }

    func take() -> [Ended] { ended.withLock { e in defer { e = [] }; return e } }

    deinit {
        if wake >= 0 { close(wake) }
    }
}

/// One prompt's work off the bus thread: its own agent connection, delegated to the sender's
/// process, sending PROMPT_UNLOCK, then PROMPT_READ for each item with an access control (the agent's
/// prompter asks the person for the item's control, and the agent grants the item to the sender's
/// process: no secret comes back); ``cancel()`` (Dismiss, the sender leaving) shuts
/// it down from the bus thread, and the agent's pinentry closes.
final class PromptWork: @unchecked Sendable {
    let path: String
    let process: SecretServiceFrontEnd.DelegatedProcess
    let socketPath: String
    /// Item path → the query reading its secret; `probes`: the items read only if, once the keybag
    /// is unlocked, they turn out to have an access control.
    let reads: [String: ItemQuery]
    let probes: Set<String>
    /// Sends PROMPT_UNLOCK before the reads; false when the keybag was unlocked as the prompt was made
    /// (it is sent only if a read finds the keybag locked since).
    let unlockFirst: Bool
    let completions: PromptCompletions
    private let state = Protected<(connection: AgentConnection?, cancelled: Bool)>((connection: nil, cancelled: false))

    init(path: String, process: SecretServiceFrontEnd.DelegatedProcess, socketPath: String, reads: [String: ItemQuery] = [:],
         probes: Set<String> = [], unlockFirst: Bool = true, completions: PromptCompletions) {
        self.unlockFirst = unlockFirst
        self.path = path
        self.process = process
        self.socketPath = socketPath
        self.reads = reads
        self.probes = probes
        self.completions = completions
    }

    /// Starts the thread; false if it could not be started.
    func start() -> Bool { Threads.detach { self.run() } }

    func cancel() {
        state.withLock { s in
            s.cancelled = true
            s.connection?.cancel()
        }
    }

    private func run() {
        var unlocked = false
        do throws(SecError) {
            // HELLO goes out with DELEGATE (one round trip; the agent knows both processes already).
            let agent = try AgentConnection(path: socketPath, clientName: "coffer-secret-service", pipelineHello: true,
                                            replyTimeout: SecretServiceFrontEnd.agentReplyTimeout)
            let go = state.withLock { s -> Bool in
                s.connection = agent
                return !s.cancelled
            }
            if go {
                try agent.delegate(pidfd: process.pidfd, pid: process.pid, startTime: process.startTime)
                // An agent older than this front end (protocol 3) answers PROMPT_READ with secrets and
                // grants nothing: the front end, which keeps no secret, asks it for nothing then.
                guard agent.grantsPromptReads || reads.isEmpty else {
                    throw SecError(.notAvailable, "the agent speaks protocol \(agent.version), older than this front end: restart cofferd")
                }
                // The person takes as long as they take; the agent's prompter bounds the wait.
                agent.setReplyTimeout(0)
                // Unlocked after it: a call the client makes on Completed finds it so, whether or not
                // the watch has heard the agent's event yet.
                var unlockedNow = false
                func unlockKeybag() throws(SecError) {
                    let events = completions.eventCount
                    try agent.promptUnlock()
                    completions.post(inferred: .unlocked, ifNoEventSince: events)
                    unlockedNow = true
                }
                if unlockFirst { try unlockKeybag() }
                for (item, query) in reads.sorted(by: { $0.key < $1.key }) {
                    if probes.contains(item) {
                        var probe = query
                        probe.returnData = false
                        probe.returnAttributes = true
                        probe.reportsAccessState = true
                        let found: [ItemResult]
                        do { found = try agent.copyMatching(probe) } catch where error.status == .itemNotFound { continue }
                        guard found.first?.needsAuthentication == true else { continue }
                    }
                    // The reply names the item (no data): the grant is the sender's process's. (The
                    // access state is a search's flag, not PROMPT_READ's.)
                    var read = query
                    read.reportsAccessState = false
                    let found: [ItemResult]
                    do {
                        found = try agent.promptRead(read)
                    } catch where error.status == .interactionNotAllowed && !unlockedNow {
                        // Locked since the prompt was made (or nobody can be asked: then so answers the unlock).
                        try unlockKeybag()
                        found = try agent.promptRead(read)
                    }
                    guard !found.isEmpty else { throw SecError(.itemNotFound, "the item is gone") }
                }
                unlocked = true
            }
        } catch {}
        state.withLock { $0.connection = nil }
        completions.post(path, unlocked: unlocked)
    }
}
