import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// Issue #43: the agent's dialog reaches the person on a real X display, through a real GUI pinentry,
/// and only what the person does there decides. Xvfb as the session's display (`prompt-display`, as
/// on a machine without logind), Debian's pinentry-gtk2 as the agent's pinentry, xdotool as the
/// person's hands, and libsecret's `secret-tool` asking the real Secret Service front end for an item
/// while the keychain is locked. A second run cancels the dialog: the client gets a clear failure at
/// once and nothing is lost.
@Suite(.enabled(if: GUIPromptRig.available && PrivateSessionBus.available && PrivateSessionBus.clientsAvailable,
                "needs Xvfb, xdotool and pinentry-gtk2 (apt: xvfb xdotool pinentry-gtk2), dbus-daemon and libsecret-tools (contrib/deps.sh)"))
struct GUIPromptTests {
    @Test func theUnlockDialogAppearsOnTheSessionsDisplayAndThePersonsAnswerUnlocks() throws {
        let rig = try GUIPromptRig()
        let person = rig.person(typing: AgentProcess.password)
        let found = rig.lookup()
        let saw = person.finish()
        #expect(found.status == 0 && found.stdout == "s3cret", "\(found)\n\(rig.bus.read("front-end.log"))\n\(rig.agent.log)")
        // The dialog was on the session's display, titled with the app as the agent identified it.
        #expect(saw.window?.hasPrefix("Coffer: ") == true, "\(saw)")
        #expect(saw.display == rig.display.name)
        #expect(rig.agent.cli(["status"]).stdout.contains("state: unlocked"))
    }

    @Test func aCancelledDialogIsAClearFailureAndLosesNothing() throws {
        let rig = try GUIPromptRig()
        let person = rig.person(typing: nil)
        let started = Date()
        let refused = rig.lookup()
        let saw = person.finish()
        #expect(saw.window?.hasPrefix("Coffer: ") == true, "\(saw)\n\(rig.agent.log)")
        #expect(refused.status != 0 && refused.stdout.isEmpty, "\(refused)")
        #expect(Date().timeIntervalSince(started) < 60, "the cancel ended the request at once")
        #expect(rig.agent.cli(["status"]).stdout.contains("state: locked"))
        // Nothing was deleted: unlocked by other means, the item is there.
        #expect(rig.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        let after = rig.lookup()
        #expect(after.status == 0 && after.stdout == "s3cret", "\(after)")
    }
}

/// An X display, the agent whose pinentry is pinentry-gtk2 on it, the Secret Service front end on a
/// private bus, an item stored through it, and the keychain locked.
final class GUIPromptRig: @unchecked Sendable {
    static let pinentry = "/usr/bin/pinentry-gtk-2"
    static let xdotool = "/usr/bin/xdotool"
    static var available: Bool {
        [pinentry, xdotool, "/usr/bin/Xvfb"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
    }

    let display: VirtualDisplay
    let apps: SignedApps
    let agent: AgentProcess
    let bus: PrivateSessionBus
    let frontEnd: Process

    init() throws {
        display = try VirtualDisplay(width: 800, height: 600)
        (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp(
            agentConfig: ["authentication-timeout = 60", "pinentry = \(Self.pinentry)", "prompt-display = \(display.name)"])
        agent.setPasscode()
        let store = bus.run("/usr/bin/secret-tool", ["store", "--label=Mail", "server", "mail.example.com"], stdin: "s3cret")
        #expect(store.status == 0, "\(store)\n\(bus.read("front-end.log"))")
        #expect(agent.cli(["lock"]).status == 0)
    }

    func lookup() -> CLIResult { bus.run("/usr/bin/secret-tool", ["lookup", "server", "mail.example.com"]) }

    /// What the person saw: the dialog's title (nil: none appeared within the wait) and its display.
    struct Seen: Sendable, CustomStringConvertible {
        var window: String?
        var display: String
        var description: String { "dialog \(window ?? "none") on \(display)" }
    }

    /// The person at the display, on a thread of its own: waits for the agent's dialog, then types
    /// `typing` and Return into it, or presses Escape (nil). `finish()` returns what it saw.
    final class Person: @unchecked Sendable {
        private let done = DispatchSemaphore(value: 0)
        private let seen: Protected<Seen>

        init(display: String, typing: String?) {
            seen = Protected(Seen(window: nil, display: display))
            let seen = self.seen, done = self.done
            Thread.detachNewThread {
                defer { done.signal() }
                // xdotool waits for a visible window titled by the agent's prompter (at most 60 s).
                let title = GUIPromptRig.xdotool(display, ["search", "--sync", "--onlyvisible", "--name", "^Coffer: ", "getwindowname"], timeout: 60)
                guard title.status == 0, !title.stdout.isEmpty else { return }
                seen.withLock { $0.window = title.stdout.split(separator: "\n").first.map(String.init) }
                // The pinentry grabs the keyboard: the person's keys go to it.
                if let typing {
                    _ = GUIPromptRig.xdotool(display, ["type", "--delay", "20", typing], timeout: 30)
                    _ = GUIPromptRig.xdotool(display, ["key", "Return"], timeout: 10)
                } else {
                    _ = GUIPromptRig.xdotool(display, ["key", "Escape"], timeout: 10)
                }
            }
        }

        func finish() -> Seen {
            _ = done.wait(timeout: .now() + 120)
            return seen.withLock { $0 }
        }
    }

    func person(typing: String?) -> Person { Person(display: display.name, typing: typing) }

    /// Runs xdotool on `display` (bounded by `timeout` seconds).
    static func xdotool(_ display: String, _ arguments: [String], timeout: Int) -> CLIResult {
        runCLI(["-k", "5", "\(timeout)", xdotool] + arguments, environment: ["DISPLAY": display], executable: "/usr/bin/timeout",
               timeout: Double(timeout + 10))
    }
}
