@testable import CofferNativeFrontEnd
import CofferAudit
@testable import CofferKeychain
import CofferModel
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferTestSupport
import Foundation
import Logging
import Testing

/// Issue #24, finding 1: an item's application password is guessed no faster than the passcode.
/// Failures are counted per item (persisted before each check), the unlock schedule's waits apply
/// (4 free tries, then 1 min, 5 min …), an early guess is refused with the time to wait without being
/// counted, a success resets the count, and every failure and refusal is audited. The fake clock
/// stands in for the wall clock.
@Suite struct ApplicationPasswordThrottleTests {
    static func add(_ service: String, password: String) -> (AgentRequest, ScriptedChannel) {
        (AuthenticationTests.add("application-password", service: service),
         ScriptedChannel([.answer(.applicationPassword(secret(password)))]))
    }

    static func guess(_ rig: AgentRig, _ s: inout Session, _ service: String, _ password: String) -> AgentResponse {
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(applicationPassword: secret(password))), session: &s)
        return rig.pipeline.handle(AuthenticationTests.get(service), session: &s, channel: ScriptedChannel([]))
    }

    static func message(_ r: AgentResponse) -> String {
        if case .error(let e) = r { return e.message }
        return "\(r)"
    }

    @Test func guessesBeyondTheFreeTriesWaitAndASuccessResets() throws {
        var (rig, s) = try AuthenticationTests.ready(FakeSensor(enrolled: false))
        for service in ["a", "b"] {
            let (request, channel) = Self.add(service, password: "open sesame")
            #expect(errorStatus(rig.pipeline.handle(request, session: &s, channel: channel)) == nil)
        }
        // Four free wrong guesses at item a, each counted.
        for n in 1...4 {
            let r = Self.guess(rig, &s, "a", "guess \(n)")
            #expect(errorStatus(r) == .authFailed && !Self.message(r).contains("try again"), "\(r)")
        }
        // The fifth, even the right password, is refused at once with the wait (not counted).
        for password in ["guess 5", "open sesame"] {
            let early = Self.guess(rig, &s, "a", password)
            #expect(errorStatus(early) == .authFailed && Self.message(early).contains("try again in 60 s"), "\(early)")
        }
        // Item b is not delayed by a's failures.
        #expect(AuthenticationTests.secretText(Self.guess(rig, &s, "b", "open sesame")) == "pin 1234")
        // Nor does a DELETE's proof get around the wait.
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(applicationPassword: secret("open sesame"))), session: &s)
        let delete = rig.pipeline.handle(.delete(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("a")])), session: &s)
        #expect(errorStatus(delete) == .authFailed && Self.message(delete).contains("try again"), "\(delete)")
        // After the minute the right password opens it, and the count starts again.
        rig.clock.advance(60)
        #expect(AuthenticationTests.secretText(Self.guess(rig, &s, "a", "open sesame")) == "pin 1234")
        for n in 1...4 { #expect(!Self.message(Self.guess(rig, &s, "a", "again \(n)")).contains("try again")) }
        #expect(Self.message(Self.guess(rig, &s, "a", "again 5")).contains("try again in 60 s"))
        // A wrong guess after the wait is counted: the next wait is 5 min.
        rig.clock.advance(60)
        #expect(!Self.message(Self.guess(rig, &s, "a", "again 6")).contains("try again"))
        #expect(Self.message(Self.guess(rig, &s, "a", "again 7")).contains("try again in 5 min"))

        // Audited: each failure and each early refusal, with the item's group and class.
        let records = AuditReader.read(directory: rig.dir.path).records
        let failed = records.filter { $0.operation == "app-password-failed" }
        let refused = records.filter { $0.operation == "app-password-refused" }
        #expect(failed.count == 9 && refused.count == 5, "\(records.map(\.operation))")
        #expect((failed + refused).allSatisfy { $0.result == SecStatus.authFailed.rawValue && $0.accessGroup == "bank"
                && $0.itemClass == .genericPassword && $0.app == "com.example.bank" })
        // The state file counts the item's failures by its persistent reference, and never holds a password.
        let file = try String(contentsOfFile: rig.dir.file(ApplicationPasswordAttempts.fileName), encoding: .utf8)
        #expect(file.hasPrefix("coffer app-password-attempts v1\n") && !file.contains("again") && !file.contains("sesame"), "\(file)")
    }

    /// A read through a grant (PROMPT_READ's, CallerSessions) carries the application password the
    /// person gave: the throttle counts its attempts as any other, and the audit log records them as
    /// any other (a grant's read refused while another process's wrong guesses hold the item back).
    @Test func anAttemptMadeThroughAGrantIsAudited() throws {
        let rig = try AgentRig(sensor: FakeSensor(enrolled: false))
        // A process known by its start time, as the identity resolver knows every real caller.
        var s = rig.greetedSession(as: rig.signedCaller("com.example.bank", ["bank"]).withProcessStartTime(4711))
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)) == nil)
        let (request, channel) = Self.add("a", password: "open sesame")
        #expect(errorStatus(rig.pipeline.handle(request, session: &s, channel: channel)) == nil)
        // The person approves item a for this process (as PROMPT_READ does): a 60 s grant.
        guard case .copyMatching(let query) = AuthenticationTests.get("a") else { return }
        let granted: Int = try rig.base.service.search(query, granting: true, &s.context,
                                                       ScriptedChannel([.answer(.applicationPassword(secret("open sesame")))])) { page in
            page.items.count
        }
        #expect(granted == 1)
        // Another process (another login session) guesses wrong until item a is held back.
        var other = rig.greetedSession(as: rig.signedCaller("com.example.bank", ["bank"]).withProcessStartTime(4712))
        for n in 1...4 { #expect(errorStatus(Self.guess(rig, &other, "a", "guess \(n)")) == .authFailed) }
        #expect(Self.message(Self.guess(rig, &other, "a", "guess 5")).contains("try again"))
        func refusals() -> Int { AuditReader.read(directory: rig.dir.path).records.filter { $0.operation == "app-password-refused" }.count }
        let before = refusals()
        // The granted process reads a with no password of its own: the grant's is tried, refused as too
        // early, and that refusal is audited like the other process's.
        let r = rig.pipeline.handle(AuthenticationTests.get("a"), session: &s, channel: ScriptedChannel([]))
        #expect(errorStatus(r) == .authFailed && Self.message(r).contains("try again"), "\(r)")
        #expect(refusals() == before + 1, "the grant's attempt was not audited")
    }

    @Test func anAttemptIsWrittenDownBeforeItsCheckAndADamagedFileFailsClosed() throws {
        let dir = TemporaryDirectory("coffer-app-attempts")
        let path = dir.file(ApplicationPasswordAttempts.fileName)
        let clock = FakeClock()
        let ref = [UInt8](repeating: 7, count: 16)
        let attempts = ApplicationPasswordAttempts(path: path, delays: AttemptSchedule.standard.delays, clock: clock)
        var reported: [ApplicationPasswordAttempt.Outcome] = []
        // While the check runs (a kill -9 here), the file already counts it.
        let seen = try? attempts.attempt(ref: ref, report: { reported.append($0) }) { () throws(SecError) -> Int in
            ApplicationPasswordAttempts(path: path, delays: AttemptSchedule.standard.delays, clock: clock).failures(ref: ref)
        }
        #expect(seen == 1)
        // The success reset it; a failure stays counted, in a new instance (a restart) too.
        #expect(ApplicationPasswordAttempts(path: path, delays: AttemptSchedule.standard.delays, clock: clock).failures(ref: ref) == 0)
        #expect(throws: SecError.self) {
            try attempts.attempt(ref: ref, report: { reported.append($0) }) { () throws(SecError) in throw SecError(.authFailed, "wrong") }
        }
        #expect(ApplicationPasswordAttempts(path: path, delays: AttemptSchedule.standard.delays, clock: clock).failures(ref: ref) == 1)
        #expect(reported == [.failed(failures: 1, nextDelay: 0)])
        // Another error (not a wrong password) is not counted.
        #expect(throws: SecError.self) {
            try attempts.attempt(ref: ref, report: { reported.append($0) }) { () throws(SecError) in throw SecError(.io, "disk") }
        }
        #expect(attempts.failures(ref: ref) == 1)
        // A damaged file counts as the schedule's longest wait, for every item, and is not run.
        try "garbage\n".write(toFile: path, atomically: true, encoding: .utf8)
        let damaged = ApplicationPasswordAttempts(path: path, delays: AttemptSchedule.standard.delays, clock: clock)
        var ran = false
        do {
            try damaged.attempt(ref: [UInt8](repeating: 9, count: 16), report: { _ in }) { () throws(SecError) in ran = true }
            Issue.record("a damaged file earned attempts")
        } catch {
            #expect(error.message.contains("try again in 60 min") && !ran, "\(error)")
        }
    }

    /// Review finding 20: the `*` line a damaged file becomes holds for its wait only; then each item
    /// counts from zero again and the line leaves the file (before, every item without a line of its
    /// own got one try an hour until its first success, for good).
    @Test func aDamagedFileHealsOnceItsWaitHasPassed() throws {
        let dir = TemporaryDirectory("coffer-app-attempts")
        let path = dir.file(ApplicationPasswordAttempts.fileName)
        let clock = FakeClock()
        try "garbage\n".write(toFile: path, atomically: true, encoding: .utf8)
        let delays = AttemptSchedule.standard.delays
        let attempts = ApplicationPasswordAttempts(path: path, delays: delays, clock: clock)
        let a = [UInt8](repeating: 9, count: 16), b = [UInt8](repeating: 10, count: 16)
        #expect(attempts.failures(ref: a) == delays.count)
        clock.advance(delays.last!)
        var reported: [ApplicationPasswordAttempt.Outcome] = []
        for ref in [a, a, b] {
            #expect(throws: SecError.self) {
                try attempts.attempt(ref: ref, report: { reported.append($0) }) { () throws(SecError) in throw SecError(.authFailed, "wrong") }
            }
        }
        #expect(reported == [.failed(failures: 1, nextDelay: 0), .failed(failures: 2, nextDelay: 0), .failed(failures: 1, nextDelay: 0)])
        let file = try String(contentsOfFile: path, encoding: .utf8)
        #expect(!file.contains("*"), "\(file)")
        let restarted = ApplicationPasswordAttempts(path: path, delays: delays, clock: clock)
        #expect(restarted.failures(ref: a) == 2 && restarted.failures(ref: [UInt8](repeating: 11, count: 16)) == 0)
    }

    /// Review finding 7: erase-after erases the application-password counts too (the file is gone, and
    /// the erased keychain writes it no more).
    @Test func anEraseDeletesTheAttemptsFile() throws {
        var (rig, s) = try AuthenticationTests.ready(FakeSensor(enrolled: false))
        let (request, channel) = Self.add("a", password: "open sesame")
        #expect(errorStatus(rig.pipeline.handle(request, session: &s, channel: channel)) == nil)
        #expect(errorStatus(Self.guess(rig, &s, "a", "wrong")) == .authFailed)
        let path = rig.dir.file(ApplicationPasswordAttempts.fileName)
        #expect(FileManager.default.fileExists(atPath: path))
        _ = rig.keychain.lock()
        let service = UnlockService(keychain: rig.keychain, verifier: rig.verifier, userName: "tester", kdfPolicy: cheapKDF, clock: rig.clock,
                                    logger: .init(label: "test"), schedule: AttemptSchedule(delays: [0], eraseAfter: 1),
                                    attemptsFile: rig.dir.file("attempts")) {}
        #expect { try service.unlock(secret("wrong")) } throws: { ($0 as? SecError)?.message.contains("erased") == true }
        #expect(!FileManager.default.fileExists(atPath: path))
        #expect(throws: SecError.self) {
            try rig.keychain.appPasswordAttempts.attempt(ref: [UInt8](repeating: 1, count: 16), report: { _ in }) { () throws(SecError) in
                throw SecError(.authFailed, "wrong")
            }
        }
        #expect(!FileManager.default.fileExists(atPath: path))
    }
}
