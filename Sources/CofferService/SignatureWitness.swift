package import CofferModel
import Logging

/// One signature as the person knows it: the key (type, fingerprint, comment) and where it goes (nil: not
/// known, the key is used locally).
package struct SignatureSubject: Sendable, Equatable {
    package let keyType: String
    package let fingerprint: String
    package let comment: String
    package let destination: String?

    package init(keyType: String, fingerprint: String, comment: String, destination: String?) {
        self.keyType = keyType
        self.fingerprint = fingerprint
        self.comment = comment
        self.destination = destination
    }
}

/// A dialog that asks the person to allow one operation: the agent's prompter (its pinentry on the login
/// session's display), which the composition gives the core.
package protocol ConfirmationChannel {
    /// Shows `description`, titled with `app` as the agent identified the caller; the answer, within the
    /// prompter's deadline (the dialog ends if the client goes away meanwhile).
    func confirm(_ description: String, app: String) -> ConfirmationOutcome
    /// The operation ended: the dialog goes.
    func end()
}

/// What the person (or the prompter) answered.
package enum ConfirmationOutcome: Sendable, Equatable {
    case allowed
    case refused
    case clientGone
    case timedOut
    /// The prompter could not be asked or broke off; why (for the log).
    case failed(String)
}

/// Why a signature was allowed or refused: the audit record's `reason` (a fixed word) and its result.
package enum SignatureDecision: Sendable, Equatable {
    case allowed(reason: String)
    case refused(reason: String, status: SecStatus)

    package var reason: String {
        switch self {
        case .allowed(let r), .refused(let r, _): r
        }
    }

    package static let unconditional = SignatureDecision.allowed(reason: "no-confirmation-needed")
    package static let confirmed = SignatureDecision.allowed(reason: "confirmed")
}

extension KeychainService {
    /// The signature witness (issue #42; Secretive's `SigningWitness` is the model): the one place that
    /// decides whether a signature a front end is about to make may go ahead and writes its audit record.
    /// `refusal` is what the front end's own protocol rules already decided (an ssh destination constraint
    /// the request breaks); otherwise a key added with a confirm constraint (`ssh-add -c`) asks the person
    /// through the agent's prompter (`open`: nil when nobody can be asked, refused at once), in the one
    /// wording every signature dialog uses, naming the caller as the agent identified it.
    package func witnessSignature(_ subject: SignatureSubject, confirm: Bool, refusal: SignatureDecision? = nil, _ context: CallerContext,
                                  open: () -> (any ConfirmationChannel)?) -> SignatureDecision {
        var decision = refusal ?? .unconditional
        if refusal == nil, confirm {
            decision = askToSign(subject, context, open: open)
        }
        switch decision {
        case .allowed(let reason):
            auditSignature(context, key: subject.fingerprint, destination: subject.destination, status: .success, reason: reason)
        case .refused(let reason, let status):
            auditSignature(context, key: subject.fingerprint, destination: subject.destination, status: status, reason: reason)
            logger.notice("refused to sign", metadata: ["key": "\(subject.fingerprint)", "reason": "\(reason)",
                                                        "destination": "\(subject.destination ?? "-")", "pid": "\(context.caller.pid)"])
        }
        return decision
    }

    /// The dialog of one signature: anything but OK refuses (nobody to ask, a cancel, a prompter that
    /// fails, the deadline, the client hanging up meanwhile).
    private func askToSign(_ subject: SignatureSubject, _ context: CallerContext, open: () -> (any ConfirmationChannel)?) -> SignatureDecision {
        guard let channel = open() else { return .refused(reason: "nobody-to-ask", status: .interactionNotAllowed) }
        defer { channel.end() }
        let app = Authenticator.appName(context.caller)
        switch channel.confirm(Self.signatureQuestion(subject, app: app), app: app) {
        case .allowed: return .confirmed
        case .refused: return .refused(reason: "cancelled", status: .userCanceled)
        case .clientGone: return .refused(reason: "client-gone", status: .userCanceled)
        case .timedOut: return .refused(reason: "timed-out", status: .interactionNotAllowed)
        case .failed(let why):
            logger.warning("the prompter failed while asking to sign", metadata: ["error": "\(why)", "pid": "\(context.caller.pid)"])
            return .refused(reason: "pinentry-failed", status: .interactionNotAllowed)
        }
    }

    /// What the person reads: who asks, which key (comment, type, fingerprint), for where.
    package static func signatureQuestion(_ subject: SignatureSubject, app: String) -> String {
        var text = "\(TerminalSafeText.escaped(app)) wants to sign with your SSH key \u{201C}\(TerminalSafeText.escaped(subject.comment))\u{201D}"
            + "\n\(subject.keyType) \(subject.fingerprint)"
        if let destination = subject.destination { text += "\nfor \(TerminalSafeText.escaped(destination))" }
        return text + "\n\nAllow this signature?"
    }
}
