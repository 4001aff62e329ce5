public import CofferClient
import CofferCrypto
public import CofferModel
import CofferSystem
import Glibc

/// `coffer import pass`: a password-store (zx2c4's `pass`) into Coffer items, decrypted by the
/// user's own `gpg` (its agent and pinentry ask for the key's passphrase as `pass show` does).
///
/// Each `NAME.gpg` under the store becomes a generic password: service `pass`, account `NAME`
/// (the entry's path in the store, as `pass show NAME` names it), label `NAME`; the first line of
/// the decrypted file is the secret; the remaining lines (without trailing newlines), if any, are
/// the item's comment (`icmt`), an attribute: sealed like every attribute, but shown by
/// `coffer find`. The decrypted text comes from gpg's standard output through a socket straight into
/// secure memory: never a file, never an argument.
public enum PassImport {
    /// The item service every imported entry gets.
    public static let service = "pass"
    /// Largest decrypted entry read (a secret up to the wire's limit plus its notes).
    public static let maximumEntryBytes = SecretInput.maxBytes + 16 * 1024
    /// What gpg keeps of this process's environment (what it and its pinentry need); nothing else.
    static let keptEnvironment = ["HOME", "GNUPGHOME", "PATH", "GPG_TTY", "GPG_AGENT_INFO", "TERM", "LANG", "LC_ALL", "LC_CTYPE",
                                  "LC_MESSAGES", "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR",
                                  "DBUS_SESSION_BUS_ADDRESS", "PINENTRY_USER_DATA"]

    /// The store's directory: `explicit`, else `$PASSWORD_STORE_DIR`, else `~/.password-store`.
    public static func storeDirectory(explicit: String?) throws(SecError) -> String {
        if let explicit { return explicit }
        let env = ThisProcess.environment(["PASSWORD_STORE_DIR", "HOME"])
        if let dir = env["PASSWORD_STORE_DIR"], !dir.isEmpty { return dir }
        guard let home = env["HOME"], home.hasPrefix("/") else { throw .param("no --store given and neither PASSWORD_STORE_DIR nor HOME is set") }
        return home + "/.password-store"
    }

    /// The entries of the store at `root`: every `*.gpg` regular file below it, as paths relative
    /// to it without `.gpg`, sorted. Hidden files and directories (`.git`, `.gpg-id`, `.extensions`)
    /// are skipped, as `pass ls` does; symbolic links are not followed.
    public static func entries(in root: String) throws(SecError) -> [String] {
        var st = stat()
        guard stat(root, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else {
            throw .param("no password store at \(TerminalSafeText.escaped(root)) (give --store DIR or set PASSWORD_STORE_DIR)")
        }
        var found: [String] = []
        func walk(_ relative: String, depth: Int) {
            guard depth < 64, let dir = try? FileDescriptor.open(root + relative, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW) else { return }
            let names = dir.directoryEntries()
            try? dir.close()
            for name in names where !name.hasPrefix(".") {
                let path = relative + "/" + name
                var s = stat()
                guard lstat(root + path, &s) == 0 else { continue }
                switch s.st_mode & S_IFMT {
                case S_IFDIR: walk(path, depth: depth + 1)
                case S_IFREG where name.hasSuffix(".gpg") && name.count > 4: found.append(String(path.dropFirst().dropLast(4)))
                default: continue
                }
            }
        }
        walk("", depth: 0)
        return found.sorted()
    }

    /// Imports every entry of the store at `root` over `connection` (into access group `group`, else
    /// the caller's default one). An entry for which an item (service `pass`, account the entry, in
    /// that group) exists is reported as a duplicate and never decrypted or changed; an entry gpg
    /// cannot decrypt, or the agent refuses, is reported and the rest continue. With `dryRun`
    /// entries are decrypted (so failures show) but nothing is stored. Throws only when the store
    /// cannot be read, holds no entry, gpg is missing, or the agent is gone.
    public static func run(store root: String, group: String?, dryRun: Bool, on connection: AgentConnection) throws(SecError) -> ImportSummary {
        guard let gpg = Subprocess.find("gpg") else { throw .notAvailable("gpg is not installed; coffer import pass decrypts the store with it") }
        let names = try entries(in: root)
        guard !names.isEmpty else { throw .itemNotFound("the password store at \(TerminalSafeText.escaped(root)) has no entries (no .gpg files)") }
        try ImportTarget.requireUnlocked(connection)
        var summary = ImportSummary(dryRun: dryRun)
        for name in names {
            var attributes: Attributes = ["svce": .string(service), "acct": .string(name)]
            if let group { attributes["agrp"] = .string(group) }
            do {
                _ = try connection.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: attributes, limit: .one, returnAttributes: true))
                summary.record(name, .duplicate)
                continue
            } catch where error.status == .itemNotFound {
            } catch where error.status == .io {
                throw error // the agent is gone: nothing more can be imported
            } catch {
                summary.record(name, .failed(error.description))
                continue
            }
            let decrypted: SecureBytes
            do { decrypted = try decrypt(root + "/" + name + ".gpg", gpg: gpg) } catch {
                summary.record(name, .failed(error.message))
                continue
            }
            defer { decrypted.wipe() }
            let (secret, notes) = split(decrypted)
            defer { secret.wipe() }
            guard let notes else {
                summary.record(name, .failed("the lines after the first are not UTF-8 text"))
                continue
            }
            attributes["labl"] = .string(name)
            if !notes.isEmpty { attributes["icmt"] = .string(notes) }
            if dryRun { summary.record(name, .imported); continue }
            do {
                _ = try connection.add(NewItem(itemClass: .genericPassword, attributes: attributes, secret: secret))
                summary.record(name, .imported)
            } catch where error.status == .duplicateItem {
                summary.record(name, .duplicate)
            } catch where error.status == .io {
                throw error
            } catch {
                summary.record(name, .failed(error.description))
            }
        }
        return summary
    }

    /// The first line (the secret, in secure memory) and the rest without trailing newlines (nil if
    /// it is not UTF-8). A lone first line without a newline is the whole secret.
    static func split(_ text: SecureBytes) -> (SecureBytes, String?) {
        text.withUnsafeBytes { b in
            guard let nl = b.firstIndex(of: 0x0A) else { return (SecureBytes(copying: b), "") }
            let secret = SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[0..<nl]))
            var end = b.count
            while end > nl + 1 && (b[end - 1] == 0x0A || b[end - 1] == 0x0D) { end -= 1 }
            let rest = Array(b[(nl + 1)..<end])
            return (secret, String(validating: rest, as: UTF8.self))
        }
    }

    /// `gpg --decrypt --batch --quiet FILE`, its standard output (a socket) read into secure memory.
    /// gpg's messages go to this process's standard error; a non-zero exit is the failure's reason.
    static func decrypt(_ file: String, gpg: String) throws(SecError) -> SecureBytes {
        var environment: [String] = []
        for (k, v) in ThisProcess.environment(keptEnvironment) { environment.append("\(k)=\(v)") }
        let child: Subprocess.Child
        do {
            child = try Subprocess.spawn(executable: gpg, arguments: ["--decrypt", "--batch", "--quiet", "--yes", "--", file],
                                         environment: environment, socketAt: [1])
        } catch { throw .io("cannot start gpg: \(error)") }
        let buffer = SecureBytes(count: maximumEntryBytes + 1)
        let fd = child.socket.rawValue
        let read = buffer.withUnsafeMutableBytes { b in Result { () throws(SystemError) in try Files.readAll(fd: fd, into: b) } }
        if case .success(let n) = read, n > maximumEntryBytes {
            // Too long: stop reading; gpg gets EPIPE and ends.
            _ = shutdown(fd, Int32(SHUT_RDWR))
        }
        let status = (try? child.wait()) ?? -1
        defer { buffer.wipe() }
        guard case .success(let total) = read else { throw .io("cannot read gpg's output") }
        guard total <= maximumEntryBytes else { throw .param("the decrypted entry is larger than \(maximumEntryBytes) bytes") }
        guard status == 0 else { throw .decode("gpg could not decrypt it (exit status \(status); its message is above)") }
        return buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<total])) }
    }
}
