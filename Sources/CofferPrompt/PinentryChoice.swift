import Glibc

/// Which pinentry the agent's own dialogs use, and why (what `coffer status` shows): the one the
/// configuration names (`pinentry = PATH`), none (`pinentry = none`), or, by default, the first
/// graphical pinentry installed in the system's directories, in gpg-agent's order of preference.
///
/// The default search reads only root-owned system directories (``systemDirectories``), never
/// `PATH`: the agent's environment is one any process of the user can change (`systemctl --user
/// set-environment`), and a pinentry is what the person types the passcode into. A candidate must be
/// a regular file owned by root that only root can write, executable.
///
/// `pinentry-coffer` is never the agent's choice: it is GnuPG's pinentry, which asks Coffer itself
/// for stored passphrases. A terminal pinentry (`pinentry-curses`, `pinentry-tty`) is not either: the
/// agent has no terminal; a caller at a terminal is asked in its own terminal by the client.
public struct PinentryChoice: Sendable, Equatable, CustomStringConvertible {
    /// How the agent's configuration sets it (config key `pinentry`).
    public enum Setting: Sendable, Equatable {
        /// No `pinentry` line, or `pinentry = auto`: the first graphical pinentry found.
        case automatic
        /// `pinentry = none`: no agent-side dialogs.
        case none
        /// `pinentry = PATH`.
        case program(String)
    }

    /// The pinentry the agent runs (an absolute path), nil if none.
    public let program: String?
    /// Why this one (or why none), for the person.
    public let reason: String

    public init(program: String?, reason: String) {
        self.program = program
        self.reason = reason
    }

    public var description: String { program.map { "\($0) (\(reason))" } ?? "none (\(reason))" }

    /// The graphical pinentries the default search takes, in order (gpg-agent's preference on a
    /// desktop: GNOME's, then Qt's, then GTK 2's, then the plain X11 ones).
    public static let graphicalCandidates = ["pinentry-gnome3", "pinentry-qt", "pinentry-gtk2", "pinentry-gtk-2", "pinentry-qt5",
                                             "pinentry-x11", "pinentry-fltk"]
    /// Terminal pinentries: found, they are named in the reason, never chosen.
    public static let terminalCandidates = ["pinentry-curses", "pinentry-tty"]
    /// Where the default search looks (root-owned system directories, never `PATH`).
    public static let systemDirectories = ["/usr/local/bin", "/usr/bin", "/bin"]

    /// The choice `setting` makes on this machine; `directories` and `trustedOwner` are for tests
    /// (a private directory of candidates, owned by the test's user).
    public static func resolve(_ setting: Setting, directories: [String] = systemDirectories,
                               trustedOwner: UInt32 = 0) -> PinentryChoice {
        switch setting {
        case .none:
            return PinentryChoice(program: nil, reason: "pinentry = none in cofferd.conf: the agent shows no dialogs")
        case .program(let path):
            return PinentryChoice(program: path, reason: "pinentry = \(path) in cofferd.conf")
        case .automatic:
            let searched = "searched \(directories.joined(separator: ", ")) for \(graphicalCandidates.joined(separator: ", "))"
            for name in graphicalCandidates {
                for dir in directories {
                    let path = dir + "/" + name
                    if isTrustedExecutable(path, owner: trustedOwner) {
                        return PinentryChoice(program: path, reason: "the first graphical pinentry installed (\(searched)); pinentry = PATH chooses another")
                    }
                }
            }
            var reason = "no graphical pinentry is installed (\(searched)): install pinentry-gnome3 (or pinentry-qt, pinentry-gtk2) or set pinentry = PATH"
            let terminal = terminalCandidates.first { name in directories.contains { isTrustedExecutable($0 + "/" + name, owner: trustedOwner) } }
            if let terminal {
                reason += "; \(terminal) is installed, but the agent has no terminal: callers at a terminal are asked there by coffer"
            }
            return PinentryChoice(program: nil, reason: reason)
        }
    }

    /// A regular file (after symbolic links: Debian's alternatives), executable, owned by `owner`,
    /// and writable by nobody else, in a directory writable by nobody else.
    static func isTrustedExecutable(_ path: String, owner: UInt32) -> Bool {
        guard let resolved = realpath(path, nil) else { return false }
        defer { free(resolved) }
        let real = String(cString: resolved)
        // GnuPG's pinentry-coffer asks the agent itself: never the agent's own prompter.
        guard !real.hasSuffix("/pinentry-coffer") else { return false }
        var st = stat()
        guard stat(real, &st) == 0, st.st_mode & S_IFMT == S_IFREG, st.st_uid == owner, st.st_mode & 0o022 == 0,
              access(real, X_OK) == 0 else { return false }
        let dir = real.hasPrefix("/") ? String(real[..<(real.lastIndex(of: "/") ?? real.startIndex)]) : ""
        var dst = stat()
        guard stat(dir.isEmpty ? "/" : dir, &dst) == 0, dst.st_uid == owner || dst.st_uid == 0, dst.st_mode & 0o022 == 0 else { return false }
        return true
    }
}
