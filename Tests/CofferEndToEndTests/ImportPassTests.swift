import CofferTestSupport
import Foundation
import Testing

/// `coffer import pass` against a real password-store: a real gpg key (no passphrase) in a temporary
/// GNUPGHOME with its own gpg-agent, entries made by the real `pass insert`, imported into a real
/// agent and read back with `coffer get` and `coffer find`.
@Suite(.enabled(if: PassStore.available, "needs gpg and pass (contrib/deps.sh)"))
struct ImportPassTests {
    @Test func importsEveryEntryKeepsNotesAndNeverOverwrites() throws {
        let store = try PassStore()
        try store.insert("email/work", "pw-work\nlogin: alice\nurl: https://mail.example.org\n\n")
        try store.insert("bank", "pw-bank\n")
        try store.insert("deep/a/b", "pw deep with spaces")
        try store.insertUndecryptable("broken")
        let agent = try AgentProcess()
        // An item that is already there (another secret): reported as a duplicate, left as it is.
        var r = agent.cli(["add", "--service", "pass", "--account", "bank", "--secret-stdin"], stdin: "mine")
        #expect(r.status == 0, "\(r)")

        r = store.imported(into: agent)
        #expect(r.status == 15, "some entry failed: \(r)")
        let lines = r.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains("imported email/work") && lines.contains("imported deep/a/b"), "\(r)")
        #expect(lines.contains { $0.hasPrefix("duplicate bank") }, "\(r)")
        #expect(lines.contains { $0.hasPrefix("failed broken: ") && $0.contains("gpg could not decrypt it") }, "\(r)")
        #expect(lines.last == "2 imported, 1 skipped as duplicates, 1 failed", "\(r)")
        #expect(!r.stdout.contains("pw-") && !r.stderr.contains("pw-"), "no secret is printed")

        r = agent.cli(["get", "--service", "pass", "--account", "email/work"])
        #expect(r.status == 0 && r.stdout == "pw-work", "\(r)")
        r = agent.cli(["get", "--service", "pass", "--account", "deep/a/b"])
        #expect(r.status == 0 && r.stdout == "pw deep with spaces", "\(r)")
        r = agent.cli(["get", "--service", "pass", "--account", "bank"])
        #expect(r.status == 0 && r.stdout == "mine", "the existing item is not overwritten: \(r)")
        // The other lines are the comment (no trailing newlines); the label is the entry's path.
        r = agent.cli(["find", "--service", "pass", "--account", "email/work", "--json"])
        #expect(r.status == 0 && r.stdout.contains("\"icmt\":\"login: alice\\nurl: https://mail.example.org\"")
                && r.stdout.contains("\"labl\":\"email/work\"") && !r.stdout.contains("pw-work"), "\(r)")
        r = agent.cli(["find", "--service", "pass", "--account", "broken"])
        #expect(r.status == 3, "nothing is stored for an entry that failed: \(r)")

        // A second run (the store from PASSWORD_STORE_DIR): everything decryptable is a duplicate.
        r = agent.cli(["import", "pass"], environment: store.environment.merging(["PASSWORD_STORE_DIR": store.root]) { $1 })
        #expect(r.status == 15 && r.stdout.contains("0 imported, 3 skipped as duplicates, 1 failed"), "\(r)")
        r = agent.cli(["get", "--service", "pass", "--account", "email/work"])
        #expect(r.status == 0 && r.stdout == "pw-work", "\(r)")
    }

    @Test func aDryRunStoresNothingAndAGroupIsUsed() throws {
        let store = try PassStore()
        try store.insert("site", "pw-site\nuser: bob")
        let agent = try AgentProcess()
        var r = store.imported(into: agent, ["--dry-run"])
        #expect(r.status == 0 && r.stdout.contains("would import site") && r.stdout.contains("1 would be imported, 0 skipped"), "\(r)")
        r = agent.cli(["find", "--service", "pass"])
        #expect(r.status == 3, "a dry run stores nothing: \(r)")
        let group = try #require(agent.cli(["whoami", "--json"]).stdout.firstMatch(of: /"accessGroups":\["([^"]+)"/)?.1)
        r = store.imported(into: agent, ["--group", String(group)])
        #expect(r.status == 0 && r.stdout.contains("1 imported, 0 skipped as duplicates, 0 failed"), "\(r)")
        r = agent.cli(["find", "--service", "pass", "--account", "site", "--access-group", String(group)])
        #expect(r.status == 0 && r.stdout.contains("icmt: user: bob"), "\(r)")
    }

    @Test func anEmptyOrMissingStoreIsAClearError() throws {
        let store = try PassStore()
        let agent = try AgentProcess()
        var r = store.imported(into: agent)
        #expect(r.status == 3 && r.stderr.contains("errSecItemNotFound") && r.stderr.contains("has no entries"), "\(r)")
        r = agent.cli(["import", "pass", "--store", store.root + "/nowhere"], environment: store.environment)
        #expect(r.status == 2 && r.stderr.contains("no password store at"), "\(r)")
        r = agent.cli(["status", "--json"])
        #expect(r.stdout.contains("\"items\":0"), "\(r)")
    }

    /// A key with a passphrase: gpg-agent asks its pinentry (a scripted one) for each entry, as `pass
    /// show` would; a cancelled question fails that entry and the import goes on.
    @Test func gpgAgentsPinentryAsksForTheKeysPassphrase() throws {
        let store = try PassStore(passphrase: "key pass 1")
        try store.insert("a", "pw-a")
        try store.insert("b", "pw-b\nnote b")
        let agent = try AgentProcess()
        let pinentry = try #require(store.pinentry)
        try pinentry.set(pin: "cancel")
        var r = store.imported(into: agent)
        #expect(r.status == 15 && r.stdout.contains("failed a: gpg could not decrypt it")
                && r.stdout.contains("0 imported, 0 skipped as duplicates, 2 failed"), "\(r)")
        #expect(pinentry.takeQuestions().contains { $0.hasPrefix("GETPIN") }, "gpg-agent asked its pinentry")
        try pinentry.set(pin: "key pass 1")
        r = store.imported(into: agent)
        #expect(r.status == 0 && r.stdout.contains("2 imported, 0 skipped as duplicates, 0 failed"), "\(r)")
        r = agent.cli(["get", "--service", "pass", "--account", "b"])
        #expect(r.status == 0 && r.stdout == "pw-b", "\(r)")
    }

    /// A locked keychain: nothing is decrypted (gpg is not even asked), exit 6 with the unlock hint.
    @Test func aLockedKeychainStopsBeforeAnyEntryIsRead() throws {
        let store = try PassStore()
        try store.insert("site", "pw-site")
        let agent = try AgentProcess()
        agent.setPasscode()
        var r = agent.cli(["lock"])
        #expect(r.status == 0, "\(r)")
        r = store.imported(into: agent)
        #expect(r.status == 6 && r.stderr.contains("the keychain is locked: nothing was imported")
                && r.stderr.contains("coffer: hint: the keychain is locked; unlock it with: coffer unlock") && !r.stdout.contains("site"), "\(r)")
        r = agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password)
        #expect(r.status == 0, "\(r)")
        r = store.imported(into: agent)
        #expect(r.status == 0 && r.stdout.contains("imported site"), "\(r)")
    }
}

/// A password-store made by the real `pass` in a temporary directory, encrypted to a fresh gpg key
/// (without a passphrase unless asked) in its own GNUPGHOME (short path: gpg-agent's socket lives there); the
/// gpg-agent it starts is ended with it.
final class PassStore: @unchecked Sendable {
    let dir = PinentryHarness.ShortDirectory()
    var home: String { dir.file("g") }
    var root: String { dir.file("store") }
    var environment: [String: String] { ["GNUPGHOME": home, "PASSWORD_STORE_DIR": root] }
    /// With a passphrase: the scripted pinentry gpg-agent runs (no passphrase cache).
    private(set) var pinentry: PinentryHarness.FakePinentry?
    static var available: Bool { ["/usr/bin/gpg", "/usr/bin/pass", "/usr/bin/gpgconf"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) } }

    /// A store encrypted to a new key, protected by `passphrase` when one is given (gpg-agent then
    /// asks ``pinentry`` for it).
    init(passphrase: String? = nil) throws {
        mkdir(home, 0o700)
        if passphrase != nil {
            let fake = try PinentryHarness.FakePinentry(in: dir)
            pinentry = fake
            try "pinentry-program \(fake.path)\ndefault-cache-ttl 0\nmax-cache-ttl 0\n".write(toFile: home + "/gpg-agent.conf", atomically: true, encoding: .utf8)
        }
        let fingerprint = try generateKey("Pass Import <pass@example.org>", passphrase: passphrase ?? "")
        let r = run("/usr/bin/pass", ["init", fingerprint])
        guard r.status == 0 else { throw PinentryHarness.Failure("pass init: \(r)") }
    }

    /// A new key pair (ed25519 + cv25519, with `passphrase`, none by default); its fingerprint.
    func generateKey(_ userID: String, passphrase: String = "") throws -> String {
        var r = gpg(["--batch", "--pinentry-mode", "loopback", "--passphrase-fd", "0", "--quick-gen-key", userID, "future-default", "default", "never"],
                    stdin: passphrase + "\n")
        guard r.status == 0 else { throw PinentryHarness.Failure("gpg --quick-gen-key: \(r)") }
        r = gpg(["--batch", "--with-colons", "--list-keys", userID])
        guard let line = r.stdout.split(separator: "\n").first(where: { $0.hasPrefix("fpr:") }) else { throw PinentryHarness.Failure("no fingerprint: \(r)") }
        return String(line.split(separator: ":", omittingEmptySubsequences: false)[9])
    }

    /// `pass insert --multiline NAME` with `text` on stdin.
    func insert(_ name: String, _ text: String) throws {
        let r = run("/usr/bin/pass", ["insert", "--multiline", name], stdin: text)
        guard r.status == 0 else { throw PinentryHarness.Failure("pass insert: \(r)") }
    }

    /// An entry encrypted to a key whose secret half is then deleted: gpg cannot decrypt it.
    func insertUndecryptable(_ name: String) throws {
        let other = try generateKey("Gone <gone@example.org>")
        var r = gpg(["--batch", "--yes", "--trust-model", "always", "--recipient", other, "--encrypt", "--output", root + "/" + name + ".gpg"],
                    stdin: "pw-gone\n")
        guard r.status == 0 else { throw PinentryHarness.Failure("gpg --encrypt: \(r)") }
        r = gpg(["--batch", "--yes", "--delete-secret-keys", other])
        guard r.status == 0 else { throw PinentryHarness.Failure("gpg --delete-secret-keys: \(r)") }
    }

    /// `coffer import pass --store ROOT EXTRA…` against `agent`, with this store's GNUPGHOME.
    func imported(into agent: AgentProcess, _ extra: [String] = []) -> CLIResult {
        agent.cli(["import", "pass", "--store", root] + extra, environment: environment)
    }

    func gpg(_ args: [String], stdin: String = "") -> CLIResult { run("/usr/bin/gpg", args, stdin: stdin) }

    func run(_ executable: String, _ args: [String], stdin: String = "") -> CLIResult {
        PinentryHarness.run(executable, args, stdin: stdin, environment: environment)
    }

    deinit { _ = PinentryHarness.run("/usr/bin/gpgconf", ["--kill", "gpg-agent"], environment: ["GNUPGHOME": home]) }
}
