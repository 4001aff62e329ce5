import CofferAudit
import CofferModel
import CofferService
import CofferServiceTestSupport
import CofferTestSupport
import Testing

/// The core's signature witness (issue #42): whether a signature may go ahead is decided in the service
/// core, whichever front end asks — a confirm key's dialog in one wording naming the caller as the agent
/// identified it and the key, the front end's own refusal passed through untouched, nobody asked when
/// nobody can be, and every decision audited with its reason.
@Suite struct SignatureWitnessTests {
    /// A prompter that answers `outcome` and remembers what it showed.
    final class FakeConfirmation: ConfirmationChannel, @unchecked Sendable {
        let outcome: ConfirmationOutcome
        private(set) var shown: [(String, String)] = []
        private(set) var ended = false
        init(_ outcome: ConfirmationOutcome) { self.outcome = outcome }
        func confirm(_ description: String, app: String) -> ConfirmationOutcome {
            shown.append((description, app))
            return outcome
        }
        func end() { ended = true }
    }

    static let subject = SignatureSubject(keyType: "ssh-ed25519", fingerprint: "SHA256:abc", comment: "work laptop",
                                          destination: "user \u{201C}git\u{201D} at example.org")

    @Test func aConfirmKeyAsksInOneWordingAndEveryDecisionIsAudited() throws {
        let rig = try ServiceRig()
        let context = CallerContext(caller: rig.signedCaller("com.example.git", ["git"]))
        let yes = FakeConfirmation(.allowed)
        #expect(rig.service.witnessSignature(Self.subject, confirm: true, context) { yes } == .confirmed)
        #expect(yes.shown.count == 1 && yes.ended)
        let (text, app) = yes.shown[0]
        #expect(text.contains(app) && text.contains("work laptop") && text.contains("ssh-ed25519 SHA256:abc")
                && text.contains("example.org") && text.hasSuffix("Allow this signature?"), "\(text)")
        // No confirm constraint: nobody is asked.
        let unused = FakeConfirmation(.refused)
        #expect(rig.service.witnessSignature(Self.subject, confirm: false, context) { unused } == .unconditional)
        #expect(unused.shown.isEmpty)
        // Each answer but OK refuses, with its reason and status.
        for (outcome, reason, status) in [(ConfirmationOutcome.refused, "cancelled", SecStatus.userCanceled),
                                          (.clientGone, "client-gone", .userCanceled), (.timedOut, "timed-out", .interactionNotAllowed),
                                          (.failed("broken pipe"), "pinentry-failed", .interactionNotAllowed)] {
            let channel = FakeConfirmation(outcome)
            #expect(rig.service.witnessSignature(Self.subject, confirm: true, context) { channel } == .refused(reason: reason, status: status))
            #expect(channel.ended)
        }
        // Nobody to ask: refused at once.
        #expect(rig.service.witnessSignature(Self.subject, confirm: true, context) { nil }
                == .refused(reason: "nobody-to-ask", status: .interactionNotAllowed))
        // The front end's own refusal (an ssh destination constraint) is final: no dialog, audited as it is.
        let never = FakeConfirmation(.allowed)
        let refusal = SignatureDecision.refused(reason: "destination-not-permitted", status: .missingEntitlement)
        #expect(rig.service.witnessSignature(Self.subject, confirm: true, refusal: refusal, context) { never } == refusal)
        #expect(never.shown.isEmpty)

        let records = AuditReader.read(directory: rig.dir.path).records.filter { $0.operation == "ssh-sign" }
        #expect(records.map(\.reason) == ["confirmed", "no-confirmation-needed", "cancelled", "client-gone", "timed-out", "pinentry-failed",
                                         "nobody-to-ask", "destination-not-permitted"], "\(records.map(\.reason))")
        #expect(records.allSatisfy { $0.key == "SHA256:abc" && $0.destination == Self.subject.destination && $0.app == "com.example.git" })
        #expect(records[0].result == 0 && records[2].result == SecStatus.userCanceled.rawValue)
    }
}
