import CofferSystem
import Glibc
import Testing

/// How long the agent polls for a client's next request, and a client for the agent's reply
/// (``AdaptiveSpin``): the budget follows the median of the peer's last four waits.
@Suite struct AdaptiveSpinTests {
    static func spin(after waits: [Double]) -> AdaptiveSpin {
        var s = AdaptiveSpin(initialMicros: 50, ceilingMicros: 200)
        for w in waits { s.record(waitedMicros: w) }
        return s
    }

    @Test func beforeAnyWaitTheInitialBudget() {
        let s = Self.spin(after: [])
        #expect(s.typicalMicros == nil && s.budgetMicros == 50)
    }

    /// A client in a request loop (its requests a few microseconds apart) keeps the initial budget: a
    /// shorter one would gain nothing when the request is there at the first poll.
    @Test func aFastPeerKeepsTheInitialBudget() {
        #expect(Self.spin(after: [4, 6, 5, 5]).budgetMicros == 50)
        #expect(Self.spin(after: [12]).budgetMicros == 50)
    }

    /// A peer that works between messages (Apple's API building and bridging its query: tens of
    /// microseconds) is polled for twice its typical wait and a margin, up to the ceiling.
    @Test func aPeerThatWorksBetweenMessagesIsPolledForTwiceItsWait() {
        #expect(Self.spin(after: [60, 60, 60, 60]).budgetMicros == 130)
        #expect(Self.spin(after: [40, 80]).typicalMicros == 60)
        #expect(Self.spin(after: [40, 80]).budgetMicros == 130)
        #expect(Self.spin(after: [150, 150, 150]).budgetMicros == 200, "never past the ceiling")
        #expect(Self.spin(after: [200, 200, 200, 200]).budgetMicros == 200, "a typical wait at the ceiling is still polled for")
    }

    /// A peer whose messages come milliseconds apart (the Secret Service front end's next request waits
    /// for a D-Bus client) is not polled for: its side blocks at once.
    @Test func aSlowPeerIsNotPolledFor() {
        #expect(Self.spin(after: [2_000]).budgetMicros == 0)
        #expect(Self.spin(after: [2_000, 3_000, 1_500, 900]).budgetMicros == 0)
        #expect(Self.spin(after: [201, 201, 201]).budgetMicros == 0)
    }

    /// The median: one slow wait (a request that asked the person) does not end the polling of a fast
    /// peer, and one quick wait does not start it for a slow one; the peer's pace changing does, once
    /// it shows in most of the last four waits (older ones are forgotten).
    @Test func theMedianOfTheLastFourWaitsDecides() {
        #expect(Self.spin(after: [5, 5, 5, 3_000_000]).budgetMicros == 50)
        #expect(Self.spin(after: [5, 5, 3_000_000, 5]).budgetMicros == 50)
        #expect(Self.spin(after: [2_000, 2_000, 2_000, 5]).budgetMicros == 0)
        #expect(Self.spin(after: [2_000, 2_000, 5, 5]).budgetMicros == 0, "half and half is not yet fast")
        #expect(Self.spin(after: [2_000, 2_000, 5, 5, 5]).budgetMicros == 50)
        #expect(Self.spin(after: [5, 5, 5, 5, 2_000, 2_000, 2_000]).budgetMicros == 0)
        let typical = Self.spin(after: [1, 2, 3, 4, 100, 100, 100, 100]).typicalMicros
        #expect(typical == 100, "only the last four count: \(String(describing: typical))")
        #expect(Self.spin(after: [10, 30, 20]).typicalMicros == 20)
        #expect(Self.spin(after: [10, 40, 20, 30]).typicalMicros == 25)
    }

    /// A clock stepping back (it cannot, being monotonic, but a wait is a difference) counts as no wait.
    @Test func aNegativeWaitCountsAsNone() {
        #expect(Self.spin(after: [-5]).typicalMicros == 0)
        #expect(Self.spin(after: [-5]).budgetMicros == 50)
    }

    /// The poll tells whether the message was there at the first look (then nothing was waited for and
    /// nothing is learnt), and with a budget of 0 only looks.
    @Test func thePollSaysWhetherTheMessageWasAlreadyThere() throws {
        var fds: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        #expect(!UnixSocket.spinUntilReadable(fds[0], spinMicros: 0), "nothing there: a budget of 0 looks once")
        let t0 = Threads.monotonicSeconds()
        #expect(!UnixSocket.spinUntilReadable(fds[0], spinMicros: 300), "nothing came within the budget")
        #expect((Threads.monotonicSeconds() - t0) * 1e6 >= 300, "the budget was polled out")
        var byte: UInt8 = 7
        #expect(write(fds[1], &byte, 1) == 1)
        #expect(UnixSocket.spinUntilReadable(fds[0], spinMicros: 0))
        #expect(UnixSocket.spinUntilReadable(fds[0], spinMicros: 50), "still there: the poll only peeks")
    }
}
