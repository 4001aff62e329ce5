import CofferPrompt
import CofferTestSupport
import Foundation
import Testing

/// Issue #43: with no configuration the agent uses the first graphical pinentry installed, in
/// gpg-agent's order, and says why; it never takes a file someone else could have written, a terminal
/// pinentry, or pinentry-coffer (which asks the agent itself).
@Suite struct PinentryChoiceTests {
    /// A directory of candidate pinentries (real files: the search stats and checks them).
    final class Candidates {
        let dir = TemporaryDirectory("coffer-pinentries")

        @discardableResult
        func install(_ name: String, mode: mode_t = 0o755) -> String {
            let path = dir.file(name)
            writeFileBytes(path, Array("#!/bin/sh\nexit 0\n".utf8))
            chmod(path, mode)
            return path
        }

        func choice(_ setting: PinentryChoice.Setting = .automatic) -> PinentryChoice {
            PinentryChoice.resolve(setting, directories: [dir.path], trustedOwner: getuid())
        }
    }

    @Test func theFirstGraphicalPinentryInGpgAgentsOrderIsTaken() {
        let c = Candidates()
        c.install("pinentry-gtk2")
        let qt = c.install("pinentry-qt")
        c.install("pinentry-curses")
        let chosen = c.choice()
        #expect(chosen.program == qt, "\(chosen)")
        #expect(chosen.reason.contains("the first graphical pinentry installed") && chosen.reason.contains("pinentry = PATH"), "\(chosen.reason)")
        let gnome = c.install("pinentry-gnome3")
        #expect(c.choice().program == gnome)
    }

    @Test func nothingGraphicalMeansNoneAndTheReasonSaysWhatToInstall() {
        let c = Candidates()
        let bare = c.choice()
        #expect(bare.program == nil && bare.reason.contains("no graphical pinentry is installed") && bare.reason.contains("install pinentry-gnome3"),
                "\(bare)")
        // A terminal pinentry is named, never chosen: the agent has no terminal.
        c.install("pinentry-curses")
        let terminal = c.choice()
        #expect(terminal.program == nil && terminal.reason.contains("pinentry-curses is installed, but the agent has no terminal"), "\(terminal)")
    }

    @Test func aFileOthersCouldHaveWrittenOrNotExecutableIsPassedOver() {
        let c = Candidates()
        c.install("pinentry-gnome3", mode: 0o777)
        c.install("pinentry-qt", mode: 0o775)
        c.install("pinentry-gtk2", mode: 0o644)
        let fine = c.install("pinentry-x11")
        #expect(c.choice().program == fine, "group- or world-writable and non-executable candidates are skipped")
    }

    @Test(.enabled(if: getuid() == 0, "needs root to give a file away"))
    func aFileOfAnotherOwnerIsPassedOver() throws {
        let c = Candidates()
        let theirs = c.install("pinentry-gnome3")
        #expect(chown(theirs, 65534, 65534) == 0)
        let ours = c.install("pinentry-qt")
        #expect(c.choice().program == ours)
    }

    @Test func aSymbolicLinkCountsAsItsTargetAndPinentryCofferIsNeverTheAgents() {
        let c = Candidates()
        // Debian's alternatives: a link to a real pinentry is that pinentry.
        let gtk = c.install("pinentry-gtk-2")
        symlink(gtk, c.dir.file("pinentry-gnome3"))
        #expect(c.choice().program == c.dir.file("pinentry-gnome3"))
        // A link to pinentry-coffer (GnuPG's, which asks the agent itself) is not taken.
        unlink(c.dir.file("pinentry-gnome3"))
        let coffer = c.install("pinentry-coffer")
        symlink(coffer, c.dir.file("pinentry-gnome3"))
        #expect(c.choice().program == gtk)
        // A dangling link is nothing.
        unlink(c.dir.file("pinentry-gnome3"))
        symlink(c.dir.file("gone"), c.dir.file("pinentry-gnome3"))
        #expect(c.choice().program == gtk)
    }

    @Test func theConfigurationDecidesWhenItNamesOneOrNone() {
        let c = Candidates()
        c.install("pinentry-gnome3")
        #expect(c.choice(.none) == PinentryChoice(program: nil, reason: "pinentry = none in cofferd.conf: the agent shows no dialogs"))
        #expect(c.choice(.program("/opt/p/pinentry")) == PinentryChoice(program: "/opt/p/pinentry", reason: "pinentry = /opt/p/pinentry in cofferd.conf"))
    }

    @Test func theDefaultSearchReadsSystemDirectoriesNotPATH() {
        #expect(PinentryChoice.systemDirectories == ["/usr/local/bin", "/usr/bin", "/bin"])
        #expect(!PinentryChoice.graphicalCandidates.contains { $0.contains("curses") || $0.contains("tty") || $0.contains("coffer") })
    }
}
