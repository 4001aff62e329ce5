import CofferSystem
import Glibc

/// Moves a sync directory to and from a git remote through the installed `git` program
/// (SyncFormat.md, "Over git"): any remote git can reach (a bare repository on a disk, an SSH
/// server, a git host). Every device adds files only under paths no other device writes, so
/// rebasing this device's commits onto the remote's never conflicts. The branch is `coffer-sync`.
public struct GitTransport: Sendable {
    public static let branch = "coffer-sync"
    /// The working tree (the sync directory).
    public let directory: String
    let git: String
    let environment: [String]
    /// Where git's own output goes when a git command fails (the agent's log, escaped): the remote's
    /// words (`remote: …` lines, a URL) are not the error's, which names the command and its status.
    let report: @Sendable (String) -> Void

    /// `git`: the program's absolute path (found in `PATH` when nil). `environment`: what git runs
    /// with; by default `PATH`, `HOME` and `SSH_AUTH_SOCK` of this process (for SSH remotes),
    /// `GIT_TERMINAL_PROMPT=0` (git never asks on a terminal) and `LC_ALL=C`.
    /// `report`: receives git's output when a command fails (nothing by default).
    public init(directory: String, git: String? = nil, environment: [String]? = nil,
                report: @escaping @Sendable (String) -> Void = { _ in }) throws(SyncError) {
        self.directory = directory
        self.report = report
        let env = environment ?? Self.defaultEnvironment()
        let path = env.first { $0.hasPrefix("PATH=") }.map { String($0.dropFirst(5)) } ?? "/usr/bin:/bin"
        guard let g = git ?? Subprocess.find("git", searchPath: path) else { throw .transport("git is not installed (no git in PATH)") }
        self.git = g
        self.environment = env
    }

    static func defaultEnvironment() -> [String] {
        var env = ["GIT_TERMINAL_PROMPT=0", "LC_ALL=C", "GIT_CONFIG_NOSYSTEM=1"]
        for name in ["PATH", "HOME", "SSH_AUTH_SOCK"] {
            if let v = unsafe getenv(name) {
                let value = unsafe String(cString: v)
                env.append(name + "=" + value)
            }
        }
        return env
    }

    /// Runs git in the directory; its output on success, `.transport` with its output otherwise.
    @discardableResult
    func run(_ arguments: [String], allowFailure: Bool = false) throws(SyncError) -> (ok: Bool, output: String) {
        let fixed = ["-C", directory, "-c", "user.name=coffer-sync", "-c", "user.email=coffer-sync@localhost",
                     "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null"]
        let out: Subprocess.Output
        do { out = try Subprocess.run(executable: git, arguments: fixed + arguments, environment: environment) } catch {
            throw .transport("cannot run git: \(error)")
        }
        if out.status != 0 && !allowFailure {
            // The error names the command and its status; what git printed (a remote's messages, which
            // the remote chooses) goes to `report` only, never into an error a person reads as Coffer's.
            let command = arguments.first ?? ""
            report("git \(command) exited with \(out.status): \(out.text.trimmingSpace())")
            throw .transport("git \(command) failed (exit status \(out.status)); what git printed is in the agent's log")
        }
        return (out.status == 0, out.text)
    }

    /// Makes the directory a clone of `remote` (which may be empty: a new circle's first push fills it).
    public static func clone(remote: String, into directory: String, git: String? = nil, environment: [String]? = nil,
                             report: @escaping @Sendable (String) -> Void = { _ in }) throws(SyncError) -> GitTransport {
        do { try Files.makePrivateDirectory(directory, mode: 0o700) } catch { throw .transport("cannot make \(directory): \(error)") }
        let t = try GitTransport(directory: directory, git: git, environment: environment, report: report)
        try t.run(["init", "-q"])
        try t.run(["symbolic-ref", "HEAD", "refs/heads/" + branch])
        try t.run(["remote", "add", "origin", remote])
        return t
    }

    /// The remote branch's commit after a fetch (nil while the remote has none).
    func remoteCommit() throws(SyncError) -> String? {
        let r = try run(["rev-parse", "-q", "--verify", "refs/remotes/origin/" + Self.branch + "^{commit}"], allowFailure: true)
        return r.ok ? r.output.trimmingSpace() : nil
    }

    /// Fetches the remote and puts this device's unpushed commits on top of it. `lastSeen`: the remote
    /// commit this device saw last (``SyncState/remoteHead``); a remote whose branch no longer contains
    /// it was rolled back or rewritten, and is refused (nothing local changes). Returns the new remote commit.
    public func pull(lastSeen: String) throws(SyncError) -> String {
        try recoverInterrupted()
        try run(["fetch", "-q", "origin"])
        guard let remote = try remoteCommit() else {
            if !lastSeen.isEmpty { throw .rolledBack("the remote's \(Self.branch) branch is gone (this device saw \(lastSeen))") }
            return ""
        }
        if !lastSeen.isEmpty {
            let r = try run(["merge-base", "--is-ancestor", lastSeen, remote], allowFailure: true)
            guard r.ok else {
                throw .rolledBack("the remote went back or was rewritten: its \(Self.branch) no longer contains \(lastSeen), which this device saw")
            }
        }
        try removeUntrackedCopies(of: remote)
        let hasLocal = try run(["rev-parse", "-q", "--verify", "HEAD^{commit}"], allowFailure: true).ok
        if hasLocal {
            // --autostash: this device's own changes not yet committed (a compaction or a push that a
            // lock or a kill cut short) ride along; without it git refuses every later rebase.
            try run(["rebase", "-q", "--autostash", remote])
        } else {
            try run(["reset", "-q", "--hard", remote])
        }
        return remote
    }

    /// Undoes what a git killed half-way left (the agent killed during a sync: its git gets SIGKILL with
    /// it): a stale index lock and an unfinished rebase, which would refuse every later sync. Only this
    /// device's sync thread runs git in the directory, so no live git holds them.
    func recoverInterrupted() throws(SyncError) {
        let dot = directory + "/.git/"
        // Every lock file a git killed mid-run left (index.lock, a ref's lock after a fetch,
        // packed-refs.lock …): git refuses to touch a locked file ever after. None can be live here:
        // git runs in this clone only under the sync engine's lock, one at a time, and the agent
        // holds the state directory alone.
        Self.removeLockFiles(in: directory + "/.git", recursing: false)
        Self.removeLockFiles(in: directory + "/.git/refs", recursing: true)
        if Files.exists(dot + "rebase-merge") || Files.exists(dot + "rebase-apply") {
            // A rebase killed while it wrote its state (before it moved HEAD) leaves a directory that
            // `--abort` cannot read ("could not read 'rebase-merge/head-name'") and leaves in place, as a
            // run under load met: `--quit` then removes it without touching HEAD, the index or the
            // files (an autostash it made goes to the stash list).
            if !(try run(["rebase", "--abort"], allowFailure: true).ok) {
                try run(["rebase", "--quit"], allowFailure: true)
            }
        }
    }

    /// Unlinks the `*.lock` files in `dir` (and, `recursing`, its subdirectories), never following a link.
    static func removeLockFiles(in dir: String, recursing: Bool) {
        guard let fd = try? FileDescriptor.open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW) else { return }
        for name in fd.directoryEntries() {
            if name.hasSuffix(".lock") {
                _ = unsafe unlinkat(fd.rawValue, name, 0)
            } else if recursing {
                removeLockFiles(in: dir + "/" + name, recursing: true)
            }
        }
    }

    /// Deletes untracked files at paths `commit` has: what a checkout killed half-way wrote (whole or
    /// cut short; the index never recorded them), which would make every later checkout refuse to
    /// overwrite them. No two devices write one path, so such a path is another device's (this
    /// device's own files are tracked once committed, and its unpushed ones are not in `commit`).
    func removeUntrackedCopies(of commit: String) throws(SyncError) {
        let untracked = try run(["ls-files", "-o", "--exclude-standard"]).output.split(separator: "\n").map(String.init)
        for path in untracked where !path.isEmpty {
            if try run(["cat-file", "-e", commit + ":" + path], allowFailure: true).ok { _ = unsafe unlink(directory + "/" + path) }
        }
    }

    /// Commits what this device wrote (its records, its device file, circle epochs it signed) and
    /// pushes; when another device pushed first, fetches, rebases and tries again (up to `attempts`
    /// times). Returns the remote commit now holding this device's changes.
    public func push(lastSeen: String, message: String, attempts: Int = 5) throws(SyncError) -> String {
        try recoverInterrupted()
        try run(["add", "-A", "--", "."])
        let staged = try run(["diff", "--cached", "--quiet"], allowFailure: true)
        if !staged.ok { try run(["commit", "-q", "-m", message]) }
        guard try run(["rev-parse", "-q", "--verify", "HEAD^{commit}"], allowFailure: true).ok else { return lastSeen }
        var seen = lastSeen
        for _ in 0..<attempts {
            if try run(["push", "-q", "origin", "HEAD:refs/heads/" + Self.branch], allowFailure: true).ok {
                try run(["fetch", "-q", "origin"])
                return try remoteCommit() ?? seen
            }
            seen = try pull(lastSeen: seen)
        }
        throw .transport("the remote kept changing while pushing (\(attempts) attempts); try again")
    }
}
