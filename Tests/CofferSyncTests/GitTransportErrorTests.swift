import CofferModel
import CofferSync
import CofferTestSupport
import Foundation
import Testing

/// A failing git command's error names the command and its status, never what git printed: a
/// remote's `remote: …` lines and URLs are chosen by whoever runs the remote, and an error a person
/// reads as Coffer's (or a log line built from it) must not carry them (issue #44). What git printed
/// goes to the transport's `report`, which the agent logs escaped.
@Suite struct GitTransportErrorTests {
    @Test func aFailedFetchNamesTheCommandAndReportsGitsOutputApart() throws {
        let tmp = TemporaryDirectory("coffer-git-error")
        // A remote that is not a repository: git's own message quotes the path the caller gave,
        // here one with a line break and a forged log line in it.
        let remote = tmp.file("no repo\nFAKE cofferd: unlocked by admin")
        let heard = Heard()
        let git = try GitTransport.clone(remote: remote, into: tmp.file("clone"), report: { text in heard.add(text) })
        do throws(SyncError) {
            _ = try git.pull(lastSeen: "")
            Issue.record("a fetch from a remote that does not exist succeeded")
        } catch {
            #expect(error.status == .io)
            #expect(error.message.hasPrefix("git fetch failed (exit status "), "\(error.message)")
            #expect(!error.message.contains("FAKE") && !error.message.contains("no repo") && !error.message.contains("\n"), "\(error.message)")
        }
        let reported = heard.texts
        #expect(reported.count == 1 && reported[0].hasPrefix("git fetch exited with ") && reported[0].contains("FAKE"), "\(reported)")
    }
}

/// What a transport reported, from any thread.
private final class Heard: @unchecked Sendable {
    private let lock = NSLock()
    private var all: [String] = []
    func add(_ s: String) { lock.withLock { all.append(s) } }
    var texts: [String] { lock.withLock { all } }
}
