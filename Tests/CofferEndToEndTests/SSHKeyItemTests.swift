import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// SSH keys as keychain items (issue #27, part 3): `coffer ssh keygen/list/public/delete/import`, the
/// keys listed and used by cofferd's ssh-agent socket through OpenSSH's own ssh-add and ssh-keygen,
/// non-extractable, under the keybag's lock, access groups and access controls.
@Suite(.enabled(if: SSHTools.available, "needs OpenSSH's ssh-add and ssh-keygen in /usr/bin (apt: openssh-client)"))
struct SSHKeyItemTests {
    typealias Fixture = SSHAgentTests.Fixture

    /// `coffer ssh keygen`'s line saved as a .pub file (what ssh-keygen -Y sign takes to name the agent's key).
    static func savePublic(_ line: String, _ f: Fixture, _ name: String) -> String {
        let path = f.dir.file(name + ".pub")
        try? (line.trimmingCharacters(in: .whitespacesAndNewlines) + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// The authorized_keys lines `ssh-add -L` prints (type and base64 only).
    static func listedKeys(_ f: Fixture) -> [String] {
        let r = f.run("ssh-add", ["-L"])
        guard r.status == 0 else { return [] }
        return r.stdout.split(separator: "\n").map { $0.split(separator: " ").prefix(2).joined(separator: " ") }
    }

    static func head(_ line: String) -> String { line.split(separator: " ").prefix(2).joined(separator: " ") }

    @Test(arguments: ["ed25519", "ecdsa-p256", "rsa-2048"])
    func aKeyGeneratedInTheAgentSignsForOpenSSH(type: String) throws {
        let f = try Fixture()
        f.agent.setPasscode()
        let made = f.agent.cli(["ssh", "keygen", "--type", type, "--label", "laptop \(type)"])
        #expect(made.status == 0 && made.stdout.hasSuffix(" laptop \(type)\n"), "\(made)\n\(f.agent.log)")
        let line = made.stdout.trimmingCharacters(in: .newlines)
        #expect(Self.listedKeys(f) == [Self.head(line)], "ssh-add -L: \(f.run("ssh-add", ["-L"]))")
        #expect(f.agent.cli(["ssh", "public", "laptop \(type)"]).stdout == made.stdout)
        let pub = Self.savePublic(line, f, "laptop")
        #expect(f.listed() == [f.fingerprint(pub)])
        // ssh-add -T: the agent signs with it and ssh-add verifies the signature.
        let tested = f.run("ssh-add", ["-T", pub])
        #expect(tested.status == 0, "\(tested)")
        let data = f.dir.file("data")
        try "signed by a key that never left the agent\n".write(toFile: data, atomically: true, encoding: .utf8)
        let (signed, verified) = f.signAndVerify(publicKey: pub, file: data)
        #expect(signed.status == 0, "\(signed)\n\(f.agent.log)")
        #expect(verified?.status == 0, "\(String(describing: verified))")
        let list = f.agent.cli(["ssh", "list", "--json"])
        let parsed = try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [[String: Any]]
        #expect(parsed?.count == 1 && parsed?.first?["fingerprint"] as? String == f.fingerprint(pub)
                && parsed?.first?["accessible"] as? String == "when-unlocked-this-device-only", "\(list)")
        // Deleted: gone from the keychain and from ssh-add's listing.
        #expect(f.agent.cli(["ssh", "delete", f.fingerprint(pub)]).status == 0)
        #expect(Self.listedKeys(f).isEmpty && f.agent.cli(["ssh", "list"]).stdout.isEmpty)
        #expect(f.agent.cli(["ssh", "delete", f.fingerprint(pub)]).status == 3)
    }

    /// No request returns a generated key's private half, none can make it extractable, replace it,
    /// or move it to a class that goes into backups, and a key is created only ThisDeviceOnly.
    /// The installed shell helper is signed with groups `shell` (its default) and `unsigned`: a key it
    /// makes for ssh goes into `unsigned`, which ssh and ssh-add (unsigned programs) see, and it says
    /// so; one made in `shell` is invisible to them, it says that too, and `coffer move` puts it where
    /// they see it, as one change (issue #43).
    @Test func aKeyMadeForSSHIsOneSSHSeesAndMoveTakesAnotherThere() throws {
        let apps = try SignedApps()
        let helper = try apps.app("coffer-shell", appID: "org.example.shell", groups: ["shell", "unsigned"])
        let f = Fixture(agent: try apps.startAgent())
        f.agent.setPasscode()
        let env = ["COFFER_SOCKET": f.agent.socketPath]
        let made = runCLI(["ssh", "keygen", "--label", "seen"], environment: env, executable: helper)
        #expect(made.status == 0 && made.stderr.contains("access group unsigned, which ssh and ssh-add see"), "\(made)\n\(f.agent.log)")
        let hidden = runCLI(["ssh", "keygen", "--label", "hidden", "--access-group", "shell"], environment: env, executable: helper)
        #expect(hidden.status == 0 && hidden.stderr.contains("access group shell, which ssh and ssh-add (unsigned programs) do not see"), "\(hidden)")
        #expect(Self.listedKeys(f) == [Self.head(made.stdout.trimmingCharacters(in: .newlines))])
        let moved = runCLI(["move", "--class", "keys", "--label", "hidden", "--group", "unsigned"], environment: env, executable: helper)
        #expect(moved.status == 0 && moved.stderr.contains("moved 1 item to access group unsigned"), "\(moved)")
        #expect(Set(Self.listedKeys(f)) == [Self.head(made.stdout.trimmingCharacters(in: .newlines)), Self.head(hidden.stdout.trimmingCharacters(in: .newlines))])
        // A group the helper may not use: refused, nothing moved (no terminal to authorize it on).
        let refused = runCLI(["move", "--class", "keys", "--label", "seen", "--group", "org.example.other"], environment: env, executable: helper)
        #expect(refused.status != 0 && Self.listedKeys(f).count == 2, "\(refused)")
    }

    @Test func aKeyNeverLeavesTheAgent() throws {
        let f = try Fixture()
        f.agent.setPasscode()
        let made = f.agent.cli(["ssh", "keygen", "--label", "k"])
        #expect(made.status == 0, "\(made)")
        let get = f.agent.cli(["get", "--class", "keys", "--label", "k"])
        #expect(get.status == 7 && get.stdout.isEmpty && get.stderr.contains("errSecNotAvailable (-25291)"), "\(get)")
        let json = f.agent.cli(["get", "--class", "keys", "--label", "k", "--format", "json"])
        #expect(json.status == 7 && json.stdout.isEmpty, "\(json)")
        // Its attributes (the public half among them) are listed as any item's.
        let find = f.agent.cli(["find", "--class", "keys", "--json"])
        #expect(find.status == 0 && find.stdout.contains("\"extr\":false") && find.stdout.contains("\"pubk\""), "\(find)")
        for change in [["--set-attr", "extr=true"], ["--set-attr", "pubk=hex:00"], ["--accessible", "when-unlocked"]] {
            let r = f.agent.cli(["update", "--class", "keys", "--label", "k"] + change)
            #expect(r.status == 2, "\(change): \(r)")
        }
        let replaced = f.agent.cli(["update", "--class", "keys", "--label", "k", "--secret-stdin"], stdin: "not a key")
        #expect(replaced.status == 2, "\(replaced)")
        #expect(f.agent.cli(["ssh", "keygen", "--label", "k2", "--accessible", "when-unlocked"]).status == 64)
        // Through the protocol: a class that goes into backups, or an agent-set attribute, is refused.
        let c = try AgentConnection(path: f.agent.socketPath)
        let ed25519: Attributes = ["type": .integer(KeyItem.KeyType.ed25519.rawValue)]
        for (extra, status) in [(["pdmn": AttributeValue.string("ak")], SecStatus.param), (["pubk": .data([1, 2])], .param),
                                (["extr": .bool(true)], .param), (["type": .integer(1)], .param), (["bsiz": .integer(1024)], .param)] {
            do {
                _ = try c.createKey(.generate, attributes: ed25519.merging(extra) { $1 }, returning: .attributes)
                Issue.record("KEY_CREATE with \(extra) was accepted")
            } catch {
                #expect(error.status == status, "\(extra): \(error)")
            }
        }
        #expect(try c.copyMatching(ItemQuery(itemClass: .key, limit: .all, returnAttributes: true)).count == 1)
        // The keychain's own check opens every row, the key's too, and finds nothing wrong.
        let check = f.agent.cli(["check", "--json"])
        #expect(check.status == 0, "\(check)")
    }

    /// Keys made in the agent never go into a backup, not even sealed to this device (a backup of a
    /// keychain holding them is made, without them).
    @Test func keysMadeInTheAgentStayOutOfBackups() throws {
        let f = try Fixture()
        f.agent.setPasscode()
        #expect(f.agent.cli(["ssh", "keygen", "--label", "k"]).status == 0)
        #expect(f.agent.cli(["ssh", "keygen", "--label", "k2", "--accessible", "after-first-unlock-this-device-only"]).status == 0)
        #expect(f.agent.cli(["add", "--service", "mail", "--account", "me", "--secret-stdin"], stdin: "m1").status == 0)
        let files = TemporaryDirectory("coffer-ssh-backup")
        try "backup pw".write(toFile: files.file("pw"), atomically: true, encoding: .utf8)
        try AgentProcess.password.write(toFile: files.file("pc"), atomically: true, encoding: .utf8)
        let r = runShell("'\(Binaries.coffer)' backup create --out '\(files.file("b.cfbu"))' --password-fd 3 --auth-passcode-fd 4 "
                         + "3<'\(files.file("pw"))' 4<'\(files.file("pc"))'", socket: f.agent.socketPath)
        #expect(r.status == 0 && r.stderr.contains("backed up 1 item\n"), "\(r)\n\(f.agent.log)")
    }

    /// A locked keybag: the WhenUnlocked key is neither listed nor used; the AfterFirstUnlock one is
    /// both; after the unlock both are back.
    @Test func aLockedKeybagKeepsOnlyTheKeysItsClassesOpen() throws {
        let f = try Fixture()
        f.agent.setPasscode()
        let whenUnlocked = Self.savePublic(f.agent.cli(["ssh", "keygen", "--label", "wu"]).stdout, f, "wu")
        let afterFirst = Self.savePublic(f.agent.cli(["ssh", "keygen", "--label", "afu", "--accessible", "after-first-unlock-this-device-only"]).stdout,
                                         f, "afu")
        let data = f.dir.file("data")
        try "x\n".write(toFile: data, atomically: true, encoding: .utf8)
        #expect(Set(f.listed()) == [f.fingerprint(whenUnlocked), f.fingerprint(afterFirst)])
        #expect(f.agent.cli(["lock"]).status == 0)
        #expect(f.listed() == [f.fingerprint(afterFirst)], "\(f.agent.log)")
        #expect(f.signAndVerify(publicKey: afterFirst, file: data).verified?.status == 0)
        #expect(f.signAndVerify(publicKey: whenUnlocked, file: data).signed.status != 0)
        #expect(f.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(f.signAndVerify(publicKey: whenUnlocked, file: data).verified?.status == 0)
    }

    /// `coffer ssh import`: ssh-add reads the encrypted file (its passphrase through SSH_ASKPASS) and
    /// the key becomes an item: it outlives `ssh-add -D` and a restart of the agent, and signs as the
    /// file's key. A small RSA key and a file that is not a key are refused with nothing stored.
    @Test func anImportedKeyIsAnItemThatOutlivesSshAddAndARestart() throws {
        let f = try Fixture()
        f.agent.setPasscode()
        let path = f.dir.file("id_ed25519")
        #expect(f.run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "file passphrase", "-C", "me@laptop", "-f", path]).status == 0)
        let askpass = f.dir.file("askpass"), answer = f.dir.file("answer")
        try "file passphrase\n".write(toFile: answer, atomically: true, encoding: .utf8)
        try "#!/bin/sh\nexec cat '\(answer)'\n".write(toFile: askpass, atomically: true, encoding: .utf8)
        chmod(askpass, 0o700)
        let env = ["SSH_ASKPASS": askpass, "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"]
        let imported = f.agent.cli(["ssh", "import", path], environment: env)
        let filePublic = try String(contentsOfFile: path + ".pub", encoding: .utf8)
        #expect(imported.status == 0 && Self.head(imported.stdout) == Self.head(filePublic) && imported.stdout.hasSuffix(" me@laptop\n"),
                "\(imported)\n\(f.agent.log)")
        #expect(f.run("ssh-add", ["-D"]).status == 0)
        #expect(f.listed() == [f.fingerprint(path + ".pub")])
        try f.agent.restart()
        #expect(SSHAgentTests.ready(f.agent))
        #expect(f.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        let data = f.dir.file("data")
        try "y\n".write(toFile: data, atomically: true, encoding: .utf8)
        #expect(f.signAndVerify(publicKey: path + ".pub", file: data).verified?.status == 0, "\(f.agent.log)")
        // The person gives up at the passphrase prompt (an empty answer; ssh-add asks again after a
        // wrong one): ssh-add hands over nothing, nothing is stored.
        try "\n".write(toFile: answer, atomically: true, encoding: .utf8)
        let other = f.dir.file("id_other")
        #expect(f.run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "other passphrase", "-f", other]).status == 0)
        let wrong = f.agent.cli(["ssh", "import", other], environment: env)
        #expect(wrong.status == 2 && wrong.stderr.contains("ssh-add handed over no key"), "\(wrong)")
        // RSA below 2048 bits: refused by the agent.
        let small = f.dir.file("id_small")
        #expect(f.run("ssh-keygen", ["-q", "-t", "rsa", "-b", "1024", "-N", "", "-f", small]).status == 0)
        let refused = f.agent.cli(["ssh", "import", small])
        #expect(refused.status == 2 && refused.stderr.contains("errSecParam"), "\(refused)")
        #expect(f.agent.cli(["ssh", "import", f.dir.file("missing")]).status == 2)
        // A comment with a line break in it would add a line to authorized_keys: the file name is used.
        let odd = f.dir.file("id_odd")
        #expect(f.run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", "evil\nssh-ed25519 AAAA attacker", "-f", odd]).status == 0)
        let oddImport = f.agent.cli(["ssh", "import", odd])
        #expect(oddImport.status == 0 && oddImport.stdout.split(separator: "\n").count == 1 && oddImport.stdout.hasSuffix(" id_odd\n"),
                "\(oddImport)")
        #expect(f.listed() == [f.fingerprint(path + ".pub"), f.fingerprint(odd + ".pub")])
    }

    /// A key whose access control asks for the passcode: each signature asks the agent's own pinentry
    /// (the person's answer opens it; a cancel refuses); without a pinentry the signature is refused
    /// at once, never waited for.
    @Test func aProtectedKeyAsksThePersonForEachSignature() throws {
        let prompted = try SSHAgentPolicyTests.Prompted(pin: AgentProcess.password, passcode: AgentProcess.password)
        let (f, fake) = (prompted.f, prompted.fake)
        f.agent.setPasscode()
        let made = f.agent.cli(["ssh", "keygen", "--label", "guarded", "--access-control", "device-passcode"])
        #expect(made.status == 0, "\(made)")
        let pub = Self.savePublic(made.stdout, f, "guarded")
        #expect(f.listed() == [f.fingerprint(pub)], "listing needs no person")
        #expect(fake.questions.isEmpty)
        let data = f.dir.file("data")
        try "z\n".write(toFile: data, atomically: true, encoding: .utf8)
        #expect(f.signAndVerify(publicKey: pub, file: data).verified?.status == 0, "\(f.agent.log)")
        #expect(f.signAndVerify(publicKey: pub, file: data).verified?.status == 0)
        #expect(fake.pinsAsked == 2, "one question per signature: \(fake.questions)")
        try fake.set(pin: "cancel", passcode: "cancel")
        #expect(f.signAndVerify(publicKey: pub, file: data).signed.status != 0)

        let bare = try Fixture()
        bare.agent.setPasscode()
        let pub2 = Self.savePublic(bare.agent.cli(["ssh", "keygen", "--label", "g", "--access-control", "device-passcode"]).stdout, bare, "g")
        let started = Date()
        #expect(bare.signAndVerify(publicKey: pub2, file: data).signed.status != 0)
        #expect(Date().timeIntervalSince(started) < 60, "a signature nobody can authorize is refused at once")
    }

    /// A pinentry that cannot be started, or that exits in the middle of the dialog, ends the signature at
    /// once (the person cannot be asked), and the agent's log says why: the request itself only reads as
    /// cancelled, and a dialog that never appears must be explainable from the log.
    @Test func aPinentryThatFailsEndsTheSignatureAndTheLogSaysWhy() throws {
        for (program, why) in [("/bin/false", "the pinentry could not be started"), ("crash", "the pinentry exited in the middle of the dialog")] {
            let dir = PinentryHarness.ShortDirectory()
            var pinentry = program
            if program == "crash" {
                // Greets, then dies when asked for the PIN.
                pinentry = dir.file("crashing-pinentry")
                try writeExecutable("#!/bin/sh\necho OK\nwhile read -r l; do case \"$l\" in GETPIN*) kill -SEGV $$;; *) echo OK;; esac; done\n",
                                    to: pinentry)
            }
            let prompted = try SSHAgentPolicyTests.Prompted(pinentry: pinentry)
            let f = prompted.f
            f.agent.setPasscode()
            let made = f.agent.cli(["ssh", "keygen", "--label", "guarded", "--access-control", "device-passcode"])
            #expect(made.status == 0, "\(made)")
            let pub = Self.savePublic(made.stdout, f, "guarded")
            let data = f.dir.file("data")
            try "z\n".write(toFile: data, atomically: true, encoding: .utf8)
            let started = Date()
            #expect(f.signAndVerify(publicKey: pub, file: data).signed.status != 0, "\(program): signed with nobody asked")
            #expect(Date().timeIntervalSince(started) < 60, "\(program): refused at once")
            var logged = false
            for _ in 0..<200 where !logged {
                logged = f.agent.log.contains("a dialog ended without the person's answer: \(why)") && f.agent.log.contains(pinentry)
                if !logged { usleep(50_000) }
            }
            #expect(logged, "\(program): \(f.agent.log)")
            withExtendedLifetime(dir) {}
        }
    }

    /// A key whose access control asks for a finger, on an agent with the biometric emulator and no
    /// pinentry (a reader without a display): the signature waits for the touch and is made; an
    /// unknown finger makes none.
    @Test(.enabled(if: biometryPluginsBuilt, "needs the built plugins"))
    func aBiometryKeySignsAtATouchOfTheSensor() throws {
        let f = Fixture(agent: try BiometryTests.agent())
        #expect(BiometryTests.withPasscode(f.agent, ["bio", "enroll", "alice"]).status == 0)
        let made = f.agent.cli(["ssh", "keygen", "--label", "touch", "--access-control", "biometry-any"])
        #expect(made.status == 0, "\(made)")
        let pub = Self.savePublic(made.stdout, f, "touch")
        let data = f.dir.file("data")
        try "v\n".write(toFile: data, atomically: true, encoding: .utf8)
        var signing = BiometryTests.Background { f.signAndVerify(publicKey: pub, file: data) }
        #expect(BiometryTests.touch(f.agent, ["alice"], within: 20), "no evaluation waited for a finger: \(f.agent.log)")
        #expect(signing.wait().verified?.status == 0, "\(f.agent.log)")
        signing = BiometryTests.Background { f.signAndVerify(publicKey: pub, file: data) }
        #expect(BiometryTests.touch(f.agent, ["--unknown"], within: 20))
        // Unknown fingers until the lockout: the signature is refused, never made.
        for _ in 0..<4 { BiometryTests.touch(f.agent, ["--unknown"], within: 5) }
        #expect(signing.wait().signed.status != 0)
    }

    /// A thousand keychain keys: ssh-add lists them all and signs with the last. Keys whose listing
    /// would not fit in one reply (256 KiB; here long labels) are left out of it, the rest listed,
    /// instead of the listing failing.
    @Test(.enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: a thousand key generations are slow under a sanitizer, and CI's 30 minutes are short"))
    func aThousandKeysAndAListingBiggerThanOneReply() throws {
        let f = try Fixture()
        let c = try AgentConnection(path: f.agent.socketPath)
        let ed25519: Attributes = ["type": .integer(KeyItem.KeyType.ed25519.rawValue)]
        var last: [UInt8] = []
        for i in 0..<1000 {
            let made = try c.createKey(.generate, attributes: ed25519.merging(["labl": .string("k\(i)")]) { $1 }, returning: .attributes)
            if case .data(let blob)? = made?.attributes?[KeyItem.publicKeyAttribute] { last = blob }
        }
        #expect(f.listed().count == 1000)
        let line = "ssh-ed25519 " + Data(last).base64EncodedString() + " k999"
        let pub = Self.savePublic(line, f, "last")
        #expect(f.run("ssh-add", ["-T", pub]).status == 0)
        // 70 more, each with a 4000-byte label: about 4 KiB per identity, so the reply fills up.
        let long = String(repeating: "x", count: 3990)
        for i in 0..<70 {
            _ = try c.createKey(.generate, attributes: ed25519.merging(["labl": .string("\(long)\(i)")]) { $1 })
        }
        let listed = f.listed().count
        #expect(listed > 1000 && listed < 1070, "\(listed) listed")
        #expect(f.agent.log.contains("the key listing holds only the keys that fit in one reply"))
    }

    /// `ssh` logs in to a private sshd with a key made in the agent, and a protected one asks the
    /// person (the agent's pinentry) for the login's signature: a cancel refuses the login.
    @Test(.enabled(if: SSHDaemon.available, "needs /usr/sbin/sshd (apt: openssh-server)"))
    func sshLogsInWithKeychainKeys() throws {
        let prompted = try SSHAgentPolicyTests.Prompted(pin: AgentProcess.password, passcode: AgentProcess.password)
        let (f, fake) = (prompted.f, prompted.fake)
        f.agent.setPasscode()
        let plain = f.agent.cli(["ssh", "keygen", "--label", "plain"]).stdout
        let guarded = f.agent.cli(["ssh", "keygen", "--type", "ecdsa-p256", "--label", "guarded", "--access-control", "device-passcode"]).stdout
        #expect(!plain.isEmpty && !guarded.isEmpty)
        let sshd = try SSHDaemon(authorizedKeys: [guarded])
        let login = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
        #expect(login.status == 0, "\(login)\nsshd: \(sshd.log.suffix(2000))\n\(f.agent.log.suffix(3000))")
        #expect(fake.pinsAsked == 1, "the login's signature asked once: \(fake.questions)")
        try fake.set(pin: "cancel", passcode: "cancel")
        let refused = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
        #expect(refused.status == 255, "\(refused)")
        let other = try SSHDaemon(authorizedKeys: [plain])
        #expect(f.run("ssh", other.clientArguments(in: f.dir) + ["true"]).status == 0)
    }

    /// A client that goes away while the person is asked for a protected key ends the question: the
    /// agent stops its pinentry within seconds, audits the refusal as client-gone, and serves other
    /// clients meanwhile.
    @Test func aClientThatHangsUpEndsTheQuestion() throws {
        let prompted = try SSHAgentPolicyTests.Prompted(timeout: 120, pin: "hang", passcode: "hang")
        let (f, pin) = (prompted.f, prompted.dir)
        f.agent.setPasscode()
        let pub = Self.savePublic(f.agent.cli(["ssh", "keygen", "--label", "g", "--access-control", "device-passcode"]).stdout, f, "g")
        let data = f.dir.file("data")
        try "u\n".write(toFile: data, atomically: true, encoding: .utf8)
        let signer = Process()
        signer.executableURL = URL(fileURLWithPath: "/usr/bin/ssh-keygen")
        signer.arguments = ["-Y", "sign", "-f", pub, "-n", "file", data]
        signer.environment = ["SSH_AUTH_SOCK": f.sshSocket]
        signer.standardOutput = FileHandle.nullDevice
        signer.standardError = FileHandle.nullDevice
        try signer.run()
        let hungPid = pin.file("hung.pid")
        var waited = 0
        while !FileManager.default.fileExists(atPath: hungPid) && waited < 600 { usleep(50_000); waited += 1 }
        let pinentryPid = Int32(((try? String(contentsOfFile: hungPid, encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        #expect(pinentryPid > 0, "the pinentry was never asked (its questions: \(prompted.fake.questions)): \(f.agent.log)")
        #expect(f.listed() == [f.fingerprint(pub)], "another client is served while the person is asked")
        kill(signer.processIdentifier, SIGKILL)
        signer.waitUntilExit()
        // The agent notices the hang-up (within a second or so) and stops the pinentry.
        var gone = false
        for _ in 0..<600 where !gone {
            gone = kill(pinentryPid, 0) != 0 || (try? String(contentsOfFile: "/proc/\(pinentryPid)/stat", encoding: .utf8))?.contains(") Z ") == true
            if !gone { usleep(50_000) }
        }
        #expect(gone, "the pinentry still runs after the client went away: \(f.agent.log)")
        var audited = false
        for _ in 0..<100 where !audited {
            audited = auditRecords(f.agent).contains { ($0["operation"] as? String) == "ssh-sign" && ($0["reason"] as? String) == "client-gone" }
            if !audited { usleep(50_000) }
        }
        #expect(audited, "\(auditRecords(f.agent))")
    }

    /// A key with a reuse duration: the person's authentication serves the same program's next
    /// signatures (each ssh-keygen is its own connection) within the window; a lock ends it; a key
    /// without one asks each time.
    @Test func aReuseWindowServesTheSameProgramUntilALock() throws {
        let prompted = try SSHAgentPolicyTests.Prompted(pin: AgentProcess.password, passcode: AgentProcess.password)
        let (f, fake) = (prompted.f, prompted.fake)
        f.agent.setPasscode()
        #expect(f.agent.cli(["ssh", "keygen", "--label", "r", "--reuse-seconds", "1"]).status == 64, "needs --access-control")
        let pub = try prompted.reuseKey()
        let data = f.dir.file("data")
        try "w\n".write(toFile: data, atomically: true, encoding: .utf8)
        for _ in 0..<3 { #expect(f.signAndVerify(publicKey: pub, file: data).verified?.status == 0, "\(f.agent.log)") }
        #expect(fake.pinsAsked == 1, "one question for three signatures in the window")
        #expect(f.agent.cli(["lock"]).status == 0)
        #expect(f.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(f.signAndVerify(publicKey: pub, file: data).verified?.status == 0)
        #expect(fake.pinsAsked == 2, "a lock ends the window")
    }

    /// `ssh-add -l` lists the keys of the caller's access groups only: two signed copies of ssh-add
    /// (apps with groups a and b) each see their own app's key, an unsigned ssh-add sees neither.
    @Test func twoAppsSeeTheKeysOfTheirOwnGroups() throws {
        let apps = try SignedApps()
        let cliA = try apps.app("cli-a", appID: "app.a", groups: ["a"]), cliB = try apps.app("cli-b", appID: "app.b", groups: ["b"])
        let sshA = try apps.app("ssh-a", appID: "app.a.ssh", groups: ["a"], source: "/usr/bin/ssh-add")
        let sshB = try apps.app("ssh-b", appID: "app.b.ssh", groups: ["b"], source: "/usr/bin/ssh-add")
        let f = Fixture(agent: try apps.startAgent())
        f.agent.setPasscode()
        let keyA = AppClient(executable: cliA, agent: f.agent).run(["ssh", "keygen", "--label", "key of a"])
        let keyB = AppClient(executable: cliB, agent: f.agent).run(["ssh", "keygen", "--label", "key of b"])
        #expect(keyA.status == 0 && keyB.status == 0, "\(keyA)\n\(keyB)\n\(f.agent.log)")
        func listed(_ sshAdd: String) -> [String] {
            let r = runCLI(["-L"], environment: ["SSH_AUTH_SOCK": f.sshSocket], executable: sshAdd, timeout: 60)
            return r.status == 0 ? r.stdout.split(separator: "\n").map { Self.head(String($0)) } : []
        }
        #expect(listed(sshA) == [Self.head(keyA.stdout)], "\(f.agent.log)")
        #expect(listed(sshB) == [Self.head(keyB.stdout)])
        #expect(listed("/usr/bin/ssh-add").isEmpty)
    }
}
