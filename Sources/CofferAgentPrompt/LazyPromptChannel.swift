import CofferModel
import CofferService
import CofferSystem
import Glibc

/// The agent's prompter, opened at the first question (``AgentPromptChannel``): a signature whose key
/// needs nobody (no access control, or one inside its reuse window) costs nothing for it. Without a
/// configured pinentry only the biometric sensor can answer: the wait lasts while its evaluation runs
/// (until the deadline), and a question the sensor cannot answer (the passcode) ends at once as if the
/// person had gone.
package final class LazyPromptChannel: AuthChannel {
    private let open: () -> AgentPromptChannel?
    private var channel: AgentPromptChannel? = nil
    private var opened = false
    /// The client's socket (-1: none): a client that hangs up while the person is asked ends the wait.
    private let client: Int32
    /// True once a wait ended because the client hung up.
    package private(set) var clientHungUp = false

    package init(_ open: @escaping () -> AgentPromptChannel?, client: Int32 = -1) {
        self.open = open
        self.client = client
    }

    /// True if the client closed its end (POLLRDHUP / POLLHUP / POLLERR); unread requests do not count.
    private func hungUp() -> Bool {
        guard client >= 0 else { return false }
        var p = pollfd(fd: client, events: Int16(0x2000 /* POLLRDHUP */), revents: 0)
        guard poll(&p, 1, 0) > 0 else { return false }
        return p.revents & Int16(0x2000 | POLLHUP | POLLERR | POLLNVAL) != 0
    }

    func ask(_ request: AuthenticationRequest) {
        if !opened {
            opened = true
            channel = open()
        }
        channel?.ask(request)
    }

    func awaitAnswer(stop: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent {
        // `stop` is checked whenever `wake` is readable and at least every second: a hang-up ends the
        // wait within a second.
        withoutActuallyEscaping(stop) { stop in awaitAnswer(stopOrGone: { () -> Bool in
            if self.hungUp() { self.clientHungUp = true }
            return self.clientHungUp || stop()
        }, wake: wake, deadline: deadline) }
    }

    private func awaitAnswer(stopOrGone: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent {
        if let channel {
            let event = channel.awaitAnswer(stop: stopOrGone, wake: wake, deadline: deadline)
            return clientHungUp ? .gone : event
        }
        // No pinentry: only the sensor can answer (a fingerprint reader on a machine without a
        // display). With no evaluation running there is nobody to wait for.
        guard wake >= 0 else { return .gone }
        while true {
            if stopOrGone() { return clientHungUp ? .gone : .stopped }
            let left = deadline - Threads.monotonicSeconds()
            guard left > 0 else { return .timedOut }
            _ = UnixSocket.waitReadable(wake, timeoutMillis: Int32(min(left, 1) * 1000) + 1)
        }
    }

    func feedback(_ text: String, kind: AuthFeedbackKind) { channel?.feedback(text, kind: kind) }

    package func end() { channel?.end() }
}
