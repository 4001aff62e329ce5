/// How long one side of a conversation polls for the other's next message before it blocks, learnt from
/// how long the last few messages took to come (``UnixSocket/spinUntilReadable(_:spinMicros:)`` does the
/// polling).
///
/// Polling pays when the message comes sooner than a scheduler wake-up would take, and is waste when it comes
/// later: CPU time taken from the peer that must send it, on a machine with few cores. A fixed budget fits one
/// kind of peer. The agent serves a command-line client that sends its next request within microseconds, a
/// program using Apple's API that first builds and bridges a dictionary (tens of microseconds, more on a busy
/// machine), and the Secret Service front end, whose next request waits for a D-Bus client (milliseconds).
/// So the budget follows what the peer did:
/// - before anything is known, ``initialMicros``;
/// - while the typical wait (the median of the last ``window`` waits) is at most ``ceilingMicros``, twice that
///   plus ``slackMicros``, at least ``initialMicros`` and at most ``ceilingMicros``;
/// - while it is longer, none: the side blocks at once, and learns again from the waits it then measures (a
///   blocked wait counts its wake-up too, so a peer slower than the ceiling stays unpolled).
///
/// The median keeps one slow wait (a request that asked the person) from ending the polling of a fast
/// peer, and one quick one from starting it for a slow peer.
package struct AdaptiveSpin: Sendable {
    /// The budget before any wait was measured (microseconds).
    package let initialMicros: Double
    /// The longest budget, and the longest typical wait that is still polled for (microseconds).
    package let ceilingMicros: Double
    /// Added to twice the typical wait: the margin for a wait a little longer than usual.
    package static let slackMicros = 10.0
    /// How many of the last waits the typical wait is the median of.
    package static let window = 4

    private var recent: (Double, Double, Double, Double) = (0, 0, 0, 0)
    private var measured = 0

    package init(initialMicros: Double, ceilingMicros: Double) {
        precondition(initialMicros >= 0 && ceilingMicros >= initialMicros)
        self.initialMicros = initialMicros
        self.ceilingMicros = ceilingMicros
    }

    /// The budget for the next wait (microseconds; 0: block at once).
    package var budgetMicros: Double {
        guard let typical = typicalMicros else { return initialMicros }
        guard typical <= ceilingMicros else { return 0 }
        return min(ceilingMicros, max(initialMicros, 2 * typical + Self.slackMicros))
    }

    /// The median of the last waits (of as many as were measured, up to ``window``); nil before any.
    package var typicalMicros: Double? {
        // The first waits fill the slots in order, so the first `measured` hold them (no allocation: this runs
        // on every request).
        let (a, b, c, d) = recent
        switch min(measured, Self.window) {
        case 0: return nil
        case 1: return a
        case 2: return (a + b) / 2
        case 3: return a + b + c - min(a, b, c) - max(a, b, c)
        default: return (a + b + c + d - min(min(a, b), min(c, d)) - max(max(a, b), max(c, d))) / 2
        }
    }

    /// A wait that ended after `waitedMicros` (polled or blocked, until the message was there).
    package mutating func record(waitedMicros: Double) {
        let w = max(0, waitedMicros)
        switch measured % Self.window {
        case 0: recent.0 = w
        case 1: recent.1 = w
        case 2: recent.2 = w
        default: recent.3 = w
        }
        measured &+= 1
    }
}
