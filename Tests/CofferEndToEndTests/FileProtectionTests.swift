import CofferClient
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// Protected directories end to end (issue #45): the real `cofferd` and `coffer files …` over the real
/// socket, on a real ext4 with the encrypt feature on a loop device each test makes (root; skipped with
/// what is missing otherwise). Reads are made by other processes (`cat`), as another program of the
/// person would.
@Suite(.serialized, .enabled(if: LoopFilesystem.unavailable == nil, "\(LoopFilesystem.unavailable ?? "")")) struct FileProtectionTests {
    static func filesystem(megabytes: Int = 64, encrypt: Bool = true) throws -> LoopFilesystem? {
        return try LoopFilesystem(megabytes: megabytes, encrypt: encrypt)
    }

    /// `cat PATH` in another process: its output, or nil when it failed (with its error).
    static func cat(_ path: String) -> (String?, String) {
        let r = runProcess("/bin/cat", [path])
        return r.status == 0 ? (r.stdout, "") : (nil, r.stderr)
    }

    /// The `files status --json` entry of `dir` (class, key state, open files).
    static func status(_ agent: AgentProcess, _ dir: String) -> [String: Any]? {
        let r = agent.cli(["files", "status", "--json"])
        guard r.status == 0, let list = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [[String: Any]] else { return nil }
        return list.first { $0["path"] as? String == dir }
    }

    /// Waits up to `seconds` for `condition`.
    static func eventually(_ seconds: Double = 5, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            usleep(50_000)
        }
        return condition()
    }

    @Test func everyClassFollowsTheLockStateThroughPasscodeChangeAndKill9() throws {
        guard let fs = try Self.filesystem() else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        let dirs = ["complete": fs.file("c"), "until-first-auth": fs.file("u"), "none": fs.file("n"), "complete-unless-open": fs.file("o")]
        for (cls, dir) in dirs {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            if cls == "complete-unless-open" { try "before \(cls)".write(toFile: dir + "/old.txt", atomically: false, encoding: .utf8) }
            let r = agent.cli(["files", "protect", dir, "--class", cls])
            #expect(r.status == 0, "\(cls): \(r)\n\(agent.log)")
            #expect(r.stdout.contains(dir) && r.stdout.contains(cls) && r.stdout.contains("unlocked"), "\(r.stdout)")
            try "secret \(cls)".write(toFile: dir + "/file.txt", atomically: false, encoding: .utf8)
        }
        #expect(Self.cat(dirs["complete-unless-open"]! + "/old.txt").0 == "before complete-unless-open", "a migrated directory keeps its files")
        let listed = agent.cli(["files", "list"])
        #expect(listed.status == 0 && listed.stdout.split(separator: "\n").count == 4, "\(listed)")

        func expectReadable(_ readable: Set<String>, _ when: String) {
            for (cls, dir) in dirs {
                let (out, err) = Self.cat(dir + "/file.txt")
                if readable.contains(cls) {
                    #expect(out == "secret \(cls)", "\(cls) \(when): \(err)")
                } else {
                    #expect(out == nil, "\(cls) is readable \(when)")
                    #expect(err.contains("Required key not available") || err.contains("No such file"), "\(cls) \(when): \(err)")
                }
            }
        }
        let all: Set<String> = ["complete", "until-first-auth", "none", "complete-unless-open"]
        expectReadable(all, "after protect")

        // Lock: Complete and CompleteUnlessOpen become unreadable to every process; the others stay.
        #expect(agent.cli(["lock"]).status == 0)
        #expect(Self.eventually { Self.status(agent, dirs["complete"]!)?["key"] as? String == "absent" })
        expectReadable(["until-first-auth", "none"], "after lock")
        #expect(Self.status(agent, dirs["until-first-auth"]!)?["key"] as? String == "present")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.status(agent, dirs["complete"]!)?["key"] as? String == "present" })
        expectReadable(all, "after unlock")

        // A passcode change rotates the class keys: every directory stays readable, now and after a lock.
        #expect(agent.cli(["passcode", "change", "--passcode-stdin"], stdin: "\(AgentProcess.password)\n\(AgentProcess.password)\n").status == 0)
        expectReadable(all, "after a passcode change")
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.status(agent, dirs["complete"]!)?["key"] as? String == "present" })
        expectReadable(all, "after a passcode change, a lock and an unlock")

        // kill -9 while unlocked: the next agent starts locked and removes what a lock would have (and
        // UntilFirstAuth, which waits for the first unlock); None is added at start.
        agent.kill9()
        expectReadable(all, "while no agent runs (the kernel keeps the keys)")
        try agent.start()
        // (The harness sees the socket listening before the agent's start-up removed the keys: wait for it.)
        #expect(Self.eventually {
            ["complete", "complete-unless-open", "until-first-auth"].allSatisfy { Self.status(agent, dirs[$0]!)?["key"] as? String == "absent" }
        }, "\(agent.log)")
        expectReadable(["none"], "after a restart, before the first unlock")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.status(agent, dirs["until-first-auth"]!)?["key"] as? String == "present" })
        expectReadable(all, "after the first unlock after a restart")
        // UntilFirstAuth survives a lock after that first unlock.
        #expect(agent.cli(["lock"]).status == 0)
        #expect(Self.eventually { Self.status(agent, dirs["complete"]!)?["key"] as? String == "absent" })
        expectReadable(["until-first-auth", "none"], "after a lock following the first unlock")

        // lock --all: every class.
        let lockAll = agent.cli(["files", "lock", "--all"])
        #expect(lockAll.status == 0, "\(lockAll)")
        expectReadable([], "after files lock --all")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.status(agent, dirs["none"]!)?["key"] as? String == "present" })
        expectReadable(all, "after the unlock following lock --all")
        // A clean stop removes every key but None's.
        agent.stop()
        expectReadable(["none"], "after the agent stopped")
    }

    /// A backup carries the protected directories (issue #45): after the keychain is lost (its database
    /// and keybag gone, the device key kept, as after a reinstall on the same machine), `coffer backup
    /// restore` brings back each directory's record and key, its files are readable again at once, and
    /// the classes apply as before (Complete goes at the lock). A dry run and a second restore add
    /// nothing; on another device (another device key) the directories are skipped and counted.
    @Test func aBackupRestoreBringsBackTheProtectedDirectories() throws {
        guard let fs = try Self.filesystem() else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        let dirs = ["complete": fs.file("c"), "none": fs.file("n"), "complete-unless-open": fs.file("o")]
        for (cls, dir) in dirs {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            let r = agent.cli(["files", "protect", dir, "--class", cls])
            #expect(r.status == 0, "\(cls): \(r)\n\(agent.log)")
            try "secret \(cls)".write(toFile: dir + "/file.txt", atomically: false, encoding: .utf8)
        }
        #expect(agent.cli(["add", "--service", "mail", "--account", "me", "--secret-stdin"], stdin: "m-1").status == 0)
        let files = TemporaryDirectory("coffer-files-backup")
        try "backup pw".write(toFile: files.file("pw"), atomically: true, encoding: .utf8)
        let coffer = Binaries.coffer, pw = AgentProcess.password
        func run(_ a: AgentProcess, _ args: String) -> CLIResult {
            runShell("printf '%s' '\(pw)' | '\(coffer)' \(args) --auth-passcode-fd 0 3<'\(files.file("pw"))'", socket: a.socketPath)
        }
        var r = run(agent, "backup create --out '\(files.file("all.cfbu"))' --password-fd 3")
        #expect(r.status == 0 && r.stderr.contains("backed up 4 items"), "\(r)\n\(agent.log)")
        #expect(fileBytes(files.file("all.cfbu")).prefix(5) == [0x43, 0x46, 0x42, 0x55, 2], "a backup with directories is version 2")

        // The keychain is lost: the agent stops (removing every key but None's), its database and keybag go.
        #expect(agent.stop() == 0)
        for f in (try FileManager.default.contentsOfDirectory(atPath: agent.stateDir)) where f.hasPrefix("keychain.db") || f.hasPrefix("keybag") {
            try FileManager.default.removeItem(atPath: agent.stateDir + "/" + f)
        }
        try agent.start()
        agent.setPasscode()
        #expect(agent.cli(["files", "list"]).stdout.isEmpty, "a new keychain knows no directory")
        #expect(Self.cat(dirs["complete"]! + "/file.txt").0 == nil, "the key went with the old agent")

        r = run(agent, "backup restore '\(files.file("all.cfbu"))' --password-fd 3 --dry-run")
        #expect(r.status == 0 && r.stdout.contains("would add: 4"), "\(r)")
        #expect(agent.cli(["files", "list"]).stdout.isEmpty, "a dry run restored a directory")
        r = run(agent, "backup restore '\(files.file("all.cfbu"))' --password-fd 3")
        #expect(r.status == 0 && r.stdout.contains("added: 4"), "\(r)\n\(agent.log)")
        #expect(agent.cli(["get", "--service", "mail", "--account", "me"]).stdout == "m-1")
        let listed = agent.cli(["files", "list"])
        #expect(listed.stdout.split(separator: "\n").count == 3, "\(listed)")
        for (cls, dir) in dirs {
            #expect(Self.eventually { Self.cat(dir + "/file.txt").0 == "secret \(cls)" }, "\(cls) is not readable after the restore: \(Self.cat(dir + "/file.txt").1)\n\(agent.log)")
        }
        // The classes hold as before: Complete goes at the lock and comes back at the unlock.
        #expect(agent.cli(["lock"]).status == 0)
        #expect(Self.eventually { Self.status(agent, dirs["complete"]!)?["key"] as? String == "absent" })
        #expect(Self.cat(dirs["none"]! + "/file.txt").0 == "secret none")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.cat(dirs["complete"]! + "/file.txt").0 == "secret complete" })
        // Restored again: everything is already there.
        r = run(agent, "backup restore '\(files.file("all.cfbu"))' --password-fd 3")
        #expect(r.status == 0 && r.stdout.contains("added: 0") && r.stdout.contains("already present): 4"), "\(r)")

        // Another machine (another device key): the directories and nothing else this-device-only are skipped.
        let other = try AgentProcess()
        other.setPasscode()
        r = run(other, "backup restore '\(files.file("all.cfbu"))' --password-fd 3")
        #expect(r.status == 0 && r.stdout.contains("added: 1") && r.stdout.contains("another device's): 3"), "\(r)")
        #expect(other.cli(["files", "list"]).stdout.isEmpty)
    }

    /// With the device key in a TPM (swtpm), protected directories keep working as with a file: readable
    /// after an agent restart and its first unlock, after a passcode change, and after a lost keychain is
    /// restored from a backup (the TPM's device key opens the backup's directories).
    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func aTPMDeviceKeyKeepsEveryDirectoryReadableAcrossRestartsPasscodeChangesAndRestores() throws {
        guard let fs = try Self.filesystem() else { return }
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-files-tpm")
        let agent = try AgentProcess(extraArguments: ["--config", TPMAgentTests.config(control, tcti: sw.tcti)])
        agent.setPasscode()
        #expect(FileManager.default.fileExists(atPath: agent.stateDir + "/device-key.tpm"), "the device key is not the TPM's")
        let dirs = ["complete": fs.file("c"), "until-first-auth": fs.file("u"), "none": fs.file("n")]
        for (cls, dir) in dirs {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            let r = agent.cli(["files", "protect", dir, "--class", cls])
            #expect(r.status == 0, "\(cls): \(r)\n\(agent.log)")
            try "secret \(cls)".write(toFile: dir + "/file.txt", atomically: false, encoding: .utf8)
        }
        func expectAllReadable(_ when: String) {
            for (cls, dir) in dirs {
                #expect(Self.eventually { Self.cat(dir + "/file.txt").0 == "secret \(cls)" }, "\(cls) \(when): \(Self.cat(dir + "/file.txt").1)\n\(agent.log)")
            }
        }
        let files = TemporaryDirectory("coffer-files-tpm-backup")
        try "backup pw".write(toFile: files.file("pw"), atomically: true, encoding: .utf8)
        let coffer = Binaries.coffer, pw = AgentProcess.password
        let made = runShell("printf '%s' '\(pw)' | '\(coffer)' backup create --out '\(files.file("b.cfbu"))' --password-fd 3 --auth-passcode-fd 0 3<'\(files.file("pw"))'",
                            socket: agent.socketPath)
        #expect(made.status == 0 && made.stderr.contains("backed up 3 items"), "\(made)")

        #expect(agent.stop() == 0)
        #expect(Self.cat(dirs["complete"]! + "/file.txt").0 == nil, "Complete stayed readable with the agent stopped")
        try agent.start()
        #expect(Self.eventually { Self.cat(dirs["none"]! + "/file.txt").0 == "secret none" }, "None is added when the agent starts")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0, "\(agent.log)")
        expectAllReadable("after a restart and the first unlock")
        #expect(agent.cli(["passcode", "change", "--passcode-stdin"], stdin: "\(pw)\n\(pw)\n").status == 0)
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        expectAllReadable("after a passcode change, a lock and an unlock")

        // The keychain lost, the TPM's device key kept: the backup brings every directory back.
        #expect(agent.stop() == 0)
        for f in (try FileManager.default.contentsOfDirectory(atPath: agent.stateDir)) where f.hasPrefix("keychain.db") || f.hasPrefix("keybag") {
            try FileManager.default.removeItem(atPath: agent.stateDir + "/" + f)
        }
        try agent.start()
        agent.setPasscode()
        let restored = runShell("printf '%s' '\(pw)' | '\(coffer)' backup restore '\(files.file("b.cfbu"))' --password-fd 3 --auth-passcode-fd 0 3<'\(files.file("pw"))'",
                                socket: agent.socketPath)
        #expect(restored.status == 0 && restored.stdout.contains("added: 3"), "\(restored)\n\(agent.log)")
        expectAllReadable("after the restore")
    }

    @Test func anOpenFileSurvivesALockAndTheRemovalCompletesWhenItCloses() throws {
        guard let fs = try Self.filesystem() else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        for (name, cls) in [("c", "complete"), ("o", "complete-unless-open")] {
            let dir = fs.file(name)
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            #expect(agent.cli(["files", "protect", dir, "--class", cls]).status == 0)
            try "held".write(toFile: dir + "/held.txt", atomically: false, encoding: .utf8)
            try "other".write(toFile: dir + "/other.txt", atomically: false, encoding: .utf8)
            // Another process holds the file open across the lock.
            let holder = Process()
            holder.executableURL = URL(fileURLWithPath: "/bin/sh")
            holder.arguments = ["-c", "exec 3<\"$1\"; exec sleep 60", "sh", dir + "/held.txt"]
            try holder.run()
            // SIGKILL: the test runner's blocked SIGTERM is inherited by its children.
            defer { if holder.isRunning { kill(holder.processIdentifier, SIGKILL); holder.waitUntilExit() } }
            let fd = open(dir + "/held.txt", O_RDONLY)
            #expect(fd >= 0)
            #expect(Self.eventually { FileManager.default.fileExists(atPath: "/proc/\(holder.processIdentifier)/fd/3") })

            #expect(agent.cli(["lock"]).status == 0)
            #expect(Self.eventually { Self.status(agent, dir)?["key"] as? String == "incompletely-removed" }, "\(cls): \(agent.log)")
            let holders = (Self.status(agent, dir)?["openFiles"] as? [[String: Any]]) ?? []
            #expect(holders.contains { $0["pid"] as? Int == Int(holder.processIdentifier) && $0["name"] as? String == "sleep" }, "\(cls): \(holders)")
            let text = agent.cli(["files", "status", dir]).stdout
            #expect(text.contains("locking (files open)  open by: ") && text.contains("sleep (pid \(holder.processIdentifier))"), "\(text)")
            // The open file keeps working; the others are locked.
            var buffer = [UInt8](repeating: 0, count: 16)
            #expect(pread(fd, &buffer, 16, 0) == 4, "\(cls): the open file stays readable")
            #expect(Self.cat(dir + "/other.txt").0 == nil, "\(cls): another file is locked")
            // Both holders close: the agent finishes the removal by itself.
            close(fd)
            kill(holder.processIdentifier, SIGKILL)
            holder.waitUntilExit()
            #expect(Self.eventually { Self.status(agent, dir)?["key"] as? String == "absent" }, "\(cls): \(String(describing: Self.status(agent, dir)))")
            #expect(Self.cat(dir + "/held.txt").0 == nil)
            #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
            #expect(Self.eventually { Self.cat(dir + "/held.txt").0 == "held" })
        }
    }

    @Test func badInputGetsAClearErrorAndChangesNothing() throws {
        guard let fs = try Self.filesystem() else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        func refused(_ dir: String, _ message: String) {
            let r = agent.cli(["files", "protect", dir, "--class", "complete"])
            #expect(r.status != 0, "\(dir) was protected")
            #expect(r.stderr.contains(message), "\(dir): \(r.stderr)")
        }
        // A symbolic link.
        try FileManager.default.createDirectory(atPath: fs.file("real"), withIntermediateDirectories: false)
        try "kept".write(toFile: fs.file("real/a.txt"), atomically: false, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: fs.file("alias"), withDestinationPath: fs.file("real"))
        refused(fs.file("alias"), "is a symbolic link")
        // A directory of another user.
        try FileManager.default.createDirectory(atPath: fs.file("theirs"), withIntermediateDirectories: false)
        chown(fs.file("theirs"), 65534, 65534)
        refused(fs.file("theirs"), "belongs to uid 65534")
        // A path inside a protected directory.
        try FileManager.default.createDirectory(atPath: fs.file("top/outer"), withIntermediateDirectories: true)
        #expect(agent.cli(["files", "protect", fs.file("top/outer"), "--class", "none"]).status == 0)
        try FileManager.default.createDirectory(atPath: fs.file("top/outer/inner"), withIntermediateDirectories: false)
        refused(fs.file("top/outer/inner"), "is inside the encrypted directory \(fs.file("top/outer"))")
        // A directory holding a protected one; the root of a filesystem.
        refused(fs.file("top"), "the protected directory \(fs.file("top/outer"))")
        refused(fs.mountPoint, "a mount point")
        // Another filesystem: a tmpfs.
        let tmp = TemporaryDirectory("coffer-tmpfs")
        #expect(runProcess("/bin/mount", ["-t", "tmpfs", "-o", "size=1m", "coffer-test", tmp.path]).status == 0)
        defer { _ = runProcess("/bin/umount", [tmp.path]) }
        try FileManager.default.createDirectory(atPath: tmp.file("d"), withIntermediateDirectories: false)
        refused(tmp.file("d"), "is on a tmpfs filesystem, which has no fscrypt")
        // ext4 without the encrypt feature: the one-time fix.
        let plain = try #require(try Self.filesystem(megabytes: 16, encrypt: false))
        try FileManager.default.createDirectory(atPath: plain.file("d"), withIntermediateDirectories: false)
        refused(plain.file("d"), "tune2fs -O encrypt \(plain.device)")
        // coffer status: the protected directories, and whether the home directory's filesystem can hold one.
        var st = agent.cli(["status"], environment: ["HOME": plain.file("d")])
        #expect(st.stdout.contains("protected directories: 1 (1 unlocked; coffer files list)"), "\(st)")
        #expect(st.stdout.contains("fscrypt (home directory): not available for") && st.stdout.contains("tune2fs -O encrypt \(plain.device)"), "\(st)")
        st = agent.cli(["status", "--json"], environment: ["HOME": fs.mountPoint])
        let json = try? JSONSerialization.jsonObject(with: Data(st.stdout.utf8)) as? [String: Any]
        #expect(json?["fscrypt"] as? String == "available" && json?["protectedDirectories"] as? Int == 1, "\(st)")
        // Nothing changed: only the one protected directory, the others readable as before.
        let list = agent.cli(["files", "list"]).stdout.split(separator: "\n")
        #expect(list.count == 1 && list.first?.hasPrefix(fs.file("top/outer") + " ") == true, "\(list)")
        #expect(Self.cat(fs.file("alias/a.txt")).0 == "kept")
        let lsattr = runProcess("/usr/bin/lsattr", ["-d", fs.file("real"), fs.file("theirs"), fs.file("top/outer")]).stdout
        #expect(lsattr.split(separator: "\n").filter { $0.split(separator: " ").first?.contains("E") == true }.count == 1, "\(lsattr)")
    }

    /// A migration killed before its swap leaves the directory plain and whole (and `protect` again
    /// finishes it); killed after the swap, the next agent removes the old plain copy and the files read
    /// after the unlock.
    @Test(.enabled(if: RekeyCrashTests.crashPointsCompiledIn, "crash points exist only in debug builds"),
          arguments: ["files-migrate-before-swap", "files-migrate-after-swap"])
    func aMigrationKilledAtEachStepLosesNothing(at point: String) throws {
        guard let fs = try Self.filesystem() else { return }
        let a = try RekeyCrashTests.CrashableAgent()
        try a.agent.start()
        a.agent.setPasscode()
        let dir = fs.file("docs")
        let staging = fs.file(".docs.coffer-protect")
        try FileManager.default.createDirectory(atPath: dir + "/sub", withIntermediateDirectories: true)
        try "one".write(toFile: dir + "/a.txt", atomically: false, encoding: .utf8)
        try "two".write(toFile: dir + "/sub/b.txt", atomically: false, encoding: .utf8)
        a.arm(point)
        try a.agent.restart()
        #expect(a.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(a.agent.cli(["files", "protect", dir, "--class", "complete"]).status != 0)
        #expect(a.diedAtCrashPoint(), "cofferd did not stop at \(point):\n\(a.agent.log)")
        a.arm("")
        try a.agent.start()
        if point == "files-migrate-before-swap" {
            // The directory is as it was, plain; the record says the protect did not finish.
            #expect(Self.cat(dir + "/a.txt").0 == "one" && Self.cat(dir + "/sub/b.txt").0 == "two")
            let problem = Self.status(a.agent, dir)?["problem"] as? String ?? ""
            #expect(problem.contains("does not carry its encryption policy"), "\(problem)")
            #expect(a.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
            let again = a.agent.cli(["files", "protect", dir, "--class", "complete"])
            #expect(again.status == 0, "\(again)\n\(a.agent.log)")
        } else {
            // The swap happened: the next agent (locked) removed the key and the old plain copy.
            #expect(Self.eventually { !FileManager.default.fileExists(atPath: staging) }, "\(a.agent.log)")
            #expect(Self.eventually { Self.cat(dir + "/a.txt").0 == nil }, "locked after the restart: \(String(describing: Self.status(a.agent, dir)))\n\(a.agent.log)")
            #expect(a.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        }
        #expect(Self.eventually { Self.cat(dir + "/a.txt").0 == "one" }, "\(a.agent.log)")
        #expect(Self.cat(dir + "/sub/b.txt").0 == "two")
        #expect(!FileManager.default.fileExists(atPath: staging))
        #expect((Self.status(a.agent, dir)?["problem"] as? String ?? "") == "", "\(String(describing: Self.status(a.agent, dir)))")
        #expect(a.agent.cli(["lock"]).status == 0)
        #expect(Self.eventually { Self.cat(dir + "/a.txt").0 == nil })
    }

    /// Writing while locked into a CompleteUnlessOpen directory (the drop area): accepted while locked,
    /// unreadable until the unlock, then written into the directory once (never twice).
    @Test func aFileWrittenWhileLockedAppearsAfterTheUnlock() throws {
        guard let fs = try Self.filesystem() else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        let dir = fs.file("inbox"), complete = fs.file("c")
        for (d, cls) in [(dir, "complete-unless-open"), (complete, "complete")] {
            try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: false)
            #expect(agent.cli(["files", "protect", d, "--class", cls]).status == 0)
        }
        // Unlocked: written at once.
        var r = agent.cli(["files", "drop", dir, "now.txt"], stdin: "while unlocked")
        #expect(r.status == 0, "\(r)")
        #expect(Self.cat(dir + "/now.txt").0 == "while unlocked")
        #expect(agent.cli(["lock"]).status == 0)
        #expect(Self.eventually { Self.status(agent, dir)?["key"] as? String == "absent" })
        // Locked: the create itself fails, the drop is taken.
        #expect(!FileManager.default.createFile(atPath: dir + "/direct.txt", contents: Data("x".utf8)))
        r = agent.cli(["files", "drop", dir, "later.txt"], stdin: "written while locked")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["files", "drop", complete, "x.txt"], stdin: "no")
        #expect(r.status != 0 && r.stderr.contains("only a complete-unless-open directory takes files while locked"), "\(r)")
        r = agent.cli(["files", "drop", dir, "../escape"], stdin: "no")
        #expect(r.status != 0, "\(r)")
        #expect(Self.cat(dir + "/later.txt").0 == nil)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
        #expect(names.count == 1, "only the ciphertext name of now.txt: \(names)")
        // A restart in between loses nothing.
        agent.kill9()
        try agent.start()
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.cat(dir + "/later.txt").0 == "written while locked" }, "\(agent.log)")
        #expect(Self.cat(dir + "/now.txt").0 == "while unlocked")
        // Delivered once: another lock and unlock adds nothing.
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.cat(dir + "/now.txt").0 != nil })
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).sorted() == ["later.txt", "now.txt"])
    }

    /// A file larger than one request (191 KiB) written while locked goes in parts (FILES drop part) and
    /// appears whole, byte for byte, after the unlock, never in memory whole; written while unlocked, it is
    /// there at once. A part out of order, or one continuing an upload the agent did not see begin, is
    /// refused; the parts of an upload that never finished are discarded at the next unlock after a
    /// restart, and nothing else is lost.
    @Test func aFileLargerThanOneRequestWrittenWhileLockedAppearsWhole() throws {
        guard let fs = try Self.filesystem(megabytes: 96) else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        let dir = fs.file("inbox")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        #expect(agent.cli(["files", "protect", dir, "--class", "complete-unless-open"]).status == 0)
        let files = TemporaryDirectory("coffer-large-drop")
        var bytes = [UInt8](repeating: 0, count: 5 * 1_048_576 + 12_345)
        for i in bytes.indices { bytes[i] = UInt8(truncatingIfNeeded: (i &* 2_654_435_761) >> 13) }
        let source = files.file("big.bin")
        writeFileBytes(source, bytes)
        func drop(_ name: String) -> CLIResult {
            runShell("'\(Binaries.coffer)' files drop '\(dir)' '\(name)' < '\(source)'", socket: agent.socketPath)
        }
        // Unlocked: there at once.
        var r = drop("now.bin")
        #expect(r.status == 0, "\(r)\n\(agent.log)")
        #expect(Self.eventually(20) { fileBytes(dir + "/now.bin") == bytes }, "\(agent.log)")

        #expect(agent.cli(["lock"]).status == 0)
        #expect(Self.eventually { Self.status(agent, dir)?["key"] as? String == "absent" })
        r = drop("later.bin")
        #expect(r.status == 0, "\(r)\n\(agent.log)")
        // An upload that never finishes (a client gone after two parts), and parts that break the order.
        let c = try AgentConnection(path: agent.socketPath)
        let id = [UInt8](repeating: 7, count: 16)
        for index in [UInt32(0), 1] {
            _ = try c.files(.dropPart(path: dir, name: "never.bin", part: FileDropPart(dropID: id, index: index, final: false), data: secret("part \(index)")))
        }
        #expect(throws: SecError.self) {
            _ = try c.files(.dropPart(path: dir, name: "never.bin", part: FileDropPart(dropID: id, index: 3, final: true), data: secret("gap")))
        }
        let stranger = [UInt8](repeating: 9, count: 16)
        do {
            _ = try c.files(.dropPart(path: dir, name: "x.bin", part: FileDropPart(dropID: stranger, index: 1, final: true), data: secret("x")))
            Issue.record("a part continuing an unknown upload was taken")
        } catch {
            #expect(error.status == .param && error.message.contains("from its first part"), "\(error)")
        }
        #expect(!FileManager.default.fileExists(atPath: dir + "/later.bin") || fileBytes(dir + "/later.bin").isEmpty)

        // A restart: the finished file is kept, the unfinished upload is discarded at the unlock.
        agent.kill9()
        try agent.start()
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually(20) { fileBytes(dir + "/later.bin") == bytes }, "\(agent.log)")
        #expect(Self.eventually { agent.log.contains("discarded the parts of a file written while locked") }, "\(agent.log)")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).sorted() == ["later.bin", "now.bin"])
        // Delivered once: another lock and unlock adds nothing.
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { fileBytes(dir + "/now.bin") == bytes })
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).sorted() == ["later.bin", "now.bin"])
    }

    /// The client library's API for programs: protect a directory, ask a path's class, write a file
    /// into a complete-unless-open directory while locked.
    @Test func programsUseTheClientLibrary() throws {
        guard let fs = try Self.filesystem() else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        let dir = fs.file("app")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        let d = try c.protectDirectory(dir, as: .completeUnlessOpen)
        #expect(d.path == dir && d.protection == .completeUnlessOpen && d.keyState == .present && d.keyIdentifier.count == 16)
        try FileManager.default.createDirectory(atPath: dir + "/sub", withIntermediateDirectories: false)
        #expect(try c.fileProtection(ofPath: dir) == .completeUnlessOpen)
        #expect(try c.fileProtection(ofPath: dir + "/sub/x.txt") == .completeUnlessOpen)
        #expect(try c.fileProtection(ofPath: dir + "x") == nil)
        #expect(try c.fileProtection(ofPath: fs.mountPoint) == nil)
        try c.lock()
        try c.writeFile(secret("from a program"), named: "msg.txt", into: dir)
        #expect(Self.cat(dir + "/msg.txt").0 == nil)
        try c.unlock(passcode: secret(AgentProcess.password))
        #expect(Self.eventually { Self.cat(dir + "/msg.txt").0 == "from a program" })
        #expect(CofferTestSupport.status { try c.protectDirectory(dir + "/sub", as: .complete) } == .param)
    }

    /// An unlock while a removal still waits for open files: the key comes back and stays (the retries
    /// stop), also after the files close.
    @Test func anUnlockWhileARemovalWaitsKeepsTheKey() throws {
        guard let fs = try Self.filesystem() else { return }
        let agent = try AgentProcess()
        agent.setPasscode()
        let dir = fs.file("c")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        #expect(agent.cli(["files", "protect", dir, "--class", "complete"]).status == 0)
        try "held".write(toFile: dir + "/held.txt", atomically: false, encoding: .utf8)
        try "other".write(toFile: dir + "/other.txt", atomically: false, encoding: .utf8)
        let fd = open(dir + "/held.txt", O_RDONLY)
        #expect(fd >= 0)
        #expect(agent.cli(["lock"]).status == 0)
        #expect(Self.eventually { Self.status(agent, dir)?["key"] as? String == "incompletely-removed" })
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.eventually { Self.status(agent, dir)?["key"] as? String == "present" })
        close(fd)
        usleep(1_000_000)   // four retry periods
        #expect(Self.status(agent, dir)?["key"] as? String == "present")
        #expect(Self.cat(dir + "/other.txt").0 == "other")
    }

    /// A passcode change killed at every step of its rekey: whichever passcode the restarted agent takes
    /// (the old one before the commit, the new one after), every protected directory's key opens and its
    /// files read after the unlock; none is left in the kernel while locked.
    @Test(.enabled(if: RekeyCrashTests.crashPointsCompiledIn, "crash points exist only in debug builds"),
          arguments: RekeyCrashTests.points)
    func aPasscodeChangeKilledAtEachStepKeepsEveryDirectory(at point: String) throws {
        guard let fs = try Self.filesystem() else { return }
        let a = try RekeyCrashTests.CrashableAgent()
        try a.agent.start()
        a.agent.setPasscode()
        let dirs = [("complete", fs.file("c")), ("until-first-auth", fs.file("u")), ("complete-unless-open", fs.file("o"))]
        for (cls, dir) in dirs {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            #expect(a.agent.cli(["files", "protect", dir, "--class", cls]).status == 0)
            try "in \(cls)".write(toFile: dir + "/f.txt", atomically: false, encoding: .utf8)
        }
        // Items too, so that every step of the rekey is reached (rekey-reseal-half is half-way through them).
        for account in ["a", "b"] {
            #expect(a.agent.cli(["add", "--service", "files-test", "--account", account, "--secret-stdin"], stdin: "pw").status == 0)
        }
        a.arm(point)
        try a.agent.restart()
        #expect(a.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        try a.setPAMPassword(RekeyCrashTests.newPasscode)
        let c = try AgentConnection(path: a.agent.socketPath)
        let change = CofferTestSupport.status { try c.setPasscode(current: secret(AgentProcess.password), new: secret(RekeyCrashTests.newPasscode)) }
        guard change != nil else { Issue.record("\(point): the change succeeded though the agent should have died"); return }
        // Never wait for an agent that did not die (a refused change): at most 30 s.
        guard Self.eventually(30, { a.agent.process?.isRunning == false }) else {
            Issue.record("\(point): cofferd did not stop (the change failed with \(String(describing: change))):\n\(a.agent.log)")
            a.agent.kill9()
            return
        }
        #expect(a.diedAtCrashPoint(), "cofferd did not stop at \(point):\n\(a.agent.log)")
        a.arm("")
        try a.agent.start()
        // (The harness sees the socket listening before the agent's start-up removed the keys: wait for it.)
        for (cls, dir) in dirs { #expect(Self.eventually { Self.cat(dir + "/f.txt").0 == nil }, "\(point): \(cls) readable before the unlock") }
        let expected = RekeyCrashTests.beforeCommit.contains(point) ? AgentProcess.password : RekeyCrashTests.newPasscode
        try a.setPAMPassword(expected)
        let r = a.agent.cli(["unlock", "--passcode-stdin"], stdin: expected)
        #expect(r.status == 0, "\(point): \(r)\n\(a.agent.log)")
        for (cls, dir) in dirs {
            #expect(Self.eventually { Self.cat(dir + "/f.txt").0 == "in \(cls)" }, "\(point): \(cls)\n\(a.agent.log)")
        }
    }
}

/// Where protected directories cannot be tested (issue #45): a test run that is not root skips every
/// FileProtectionTests test with the reason, never passing one silently. This runner's own bundle is copied
/// where another user can reach it and run as `nobody` (setpriv), filtered to FileProtectionTests.
@Suite(.enabled(if: getuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0, "needs root and setpriv to run the tests as another user"))
struct FileProtectionSkipTests {
    @Test func withoutRootEveryProtectedDirectoryTestSkipsSayingWhy() throws {
        let bundle = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let shared = try SharedDirectory("coffer-fp-skip")
        defer { try? FileManager.default.removeItem(atPath: shared.path) }
        let copy = try shared.copyExecutable(bundle, named: "tests.xctest")
        let tmp = shared.file("tmp")
        try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: false)
        chown(tmp, 65534, 65534)
        let r = runProcess("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", copy,
                                                "--testing-library", "swift-testing", "--filter", "FileProtectionTests"],
                           environment: ["TMPDIR": tmp, "HOME": tmp], timeout: 120)
        let out = r.stdout + r.stderr
        #expect(r.status == 0, "\(out.suffix(3000))")
        #expect(out.contains("Suite FileProtectionTests") && out.contains("skipped") && out.contains("the tests must run as root"),
                "\(out.suffix(3000))")
        #expect(!out.contains("✔ Test everyClassFollowsTheLockState"), "a protected-directory test passed without root: \(out.suffix(3000))")
    }
}

