import CofferModel
import CofferSystem

/// One connection's conversation state, owned by the thread serving it (a value: nothing else sees
/// it, so it needs no lock).
struct Session: Sendable {
    /// Who connected (SO_PEERCRED at accept time, and /proc/PID/exe).
    let peer: PeerIdentity
    /// The caller's identity, established once when the connection was accepted (CofferIdentity):
    /// what the policy turns into the access groups of every item request.
    let caller: CallerIdentity
    /// The protocol version agreed in HELLO; nil until HELLO was accepted.
    private(set) var protocolVersion: UInt16? = nil
    /// The client's self-description from HELLO (for logs; never trusted).
    private(set) var clientName: String? = nil
    /// True once the client asked for lock events (the serving thread subscribes its connection).
    var wantsEvents = false
    /// True once the connection must close after the reply now being sent (a refused HELLO): nothing
    /// after it runs, not even requests the client already pipelined behind it.
    private(set) var mustClose = false
    /// Groups the user authorized (AUTHORIZE) for the rest of this connection: the shell helper's one
    /// command (a paged search is several requests).
    private(set) var authorizedGroups: Set<String> = []

    init(peer: PeerIdentity, caller: CallerIdentity) {
        self.peer = peer
        self.caller = caller
    }

    /// True once HELLO was accepted.
    var isGreeted: Bool { protocolVersion != nil }

    /// Records an accepted HELLO.
    mutating func greeted(version: UInt16, clientName: String) {
        protocolVersion = version
        self.clientName = clientName
    }

    /// Ends the conversation after the current reply.
    mutating func close() { mustClose = true }

    /// Lets this connection's item requests use `group` too.
    mutating func authorize(_ group: String) { authorizedGroups.insert(group) }
}
