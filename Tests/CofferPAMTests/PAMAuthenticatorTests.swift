import CofferCrypto
import CofferPAM
import CofferTestSupport
import Foundation
import Testing

@Suite struct PAMAuthenticatorTests {
    let sandbox: PAMSandbox
    let pam: PAMAuthenticator

    init() throws {
        sandbox = try PAMSandbox { dir in
            "auth required \(PAMWrapper.matrix) passdb=\(dir)/passdb\naccount required \(PAMWrapper.matrix) passdb=\(dir)/passdb\n"
        }
        pam = PAMAuthenticator(service: "coffer", confdir: sandbox.dir)
    }

    @Test func rightPasswordIsAccepted() throws {
        try pam.authenticate(user: currentUser, passcode: secret("s3cret pass"))
    }

    @Test func wrongPasswordsAndUsersAreRefused() {
        for wrong in ["s3cret", "s3cret pass ", "S3CRET PASS", "x"] {
            do { try pam.authenticate(user: currentUser, passcode: secret(wrong)); Issue.record("accepted") } catch {
                #expect(error.stage == "authenticate")
                #expect(!error.description.contains(wrong))
            }
        }
        #expect(throws: PAMError.self) { try pam.authenticate(user: "no-such-user-\(getpid())", passcode: secret("s3cret pass")) }
    }

    @Test func emptyAndNULPasscodesAreRefusedUpFront() {
        do { try pam.authenticate(user: currentUser, passcode: SecureBytes(count: 0)); Issue.record("accepted") } catch {
            #expect(error.stage == "input")
        }
        do { try pam.authenticate(user: currentUser, passcode: secret("s3cret pass\u{0}tail")); Issue.record("accepted") } catch {
            #expect(error.stage == "input")
        }
    }

    @Test func missingServiceIsRefused() {
        let other = PAMAuthenticator(service: "no-such-service", confdir: sandbox.dir)
        #expect(throws: PAMError.self) { try other.authenticate(user: currentUser, passcode: secret("s3cret pass")) }
    }

    @Test func accountStageCanRefuse() throws {
        let deny = try PAMSandbox { dir in "auth required \(PAMWrapper.matrix) passdb=\(dir)/passdb\naccount required pam_deny.so\n" }
        do { try PAMAuthenticator(service: "coffer", confdir: deny.dir).authenticate(user: currentUser, passcode: secret("s3cret pass")); Issue.record("accepted") } catch {
            #expect(error.stage == "account")
        }
    }

    @Test func pamExecSeesThePasswordOnStdin() throws {
        // pam_exec reports a wrong password as PAM_SYSTEM_ERR, not PAM_AUTH_ERR: both must fail.
        let sb2 = try PAMSandbox { dir in
            let script = dir + "/check.sh"
            try? "#!/bin/bash\nIFS= read -r -d '' pw\n[ \"$pw\" = \"s3cret pass\" ]\n"
                .write(toFile: script, atomically: true, encoding: .utf8)
            chmod(script, 0o755)
            return "auth required pam_exec.so expose_authtok quiet /bin/bash \(script)\naccount required pam_permit.so\n"
        }
        let p = PAMAuthenticator(service: "coffer", confdir: sb2.dir)
        try p.authenticate(user: currentUser, passcode: secret("s3cret pass"))
        #expect(throws: PAMError.self) { try p.authenticate(user: currentUser, passcode: secret("nope")) }
    }

    @Test func manySequentialAuthentications() throws {
        for i in 0..<20 {
            if i % 2 == 0 { try pam.authenticate(user: currentUser, passcode: secret("s3cret pass")) }
            else { #expect(throws: PAMError.self) { try pam.authenticate(user: currentUser, passcode: secret("bad \(i)")) } }
        }
    }
}
