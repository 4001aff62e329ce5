import CofferTestSupport
import Foundation
import LocalAuthentication
import Security
import Testing

/// The plugin host and the biometric emulator are built beside this test runner.
let biometryBuilt: Bool = {
    let dir = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? "/").deletingLastPathComponent().path
    return ["libCofferPluginBiometricEmulator.so", "coffer-plugin-host"].allSatisfy { FileManager.default.fileExists(atPath: dir + "/" + $0) }
}()

/// Biometry through LocalAuthentication and SecItem as Apple code uses them (issue #46), against an agent
/// whose biometric authenticator is Coffer's emulator: `coffer bio present NAME` is the finger on the sensor.
extension AppleSecurityAPITests {
    /// An evaluation started on another thread: `touch` while it waits, then `result()`.
    final class PendingEvaluation: @unchecked Sendable {
        private var outcome: Result<Bool, any Error>?
        private let done = DispatchSemaphore(value: 0)
        init(_ context: LAContext, _ policy: LAPolicy, reason: String) {
            context.evaluatePolicy(policy, localizedReason: reason) { [self] ok, error in
                outcome = error.map { .failure($0) } ?? .success(ok)
                done.signal()
            }
        }
        func result(within seconds: Double = 30) -> Result<Bool, any Error>? {
            done.wait(timeout: .now() + seconds) == .success ? outcome : nil
        }
    }

    /// A SecItem call started on another thread, for calls that wait for a finger.
    final class Pending<T>: @unchecked Sendable {
        private var value: T?
        private let done = DispatchSemaphore(value: 0)
        init(_ body: @escaping @Sendable () -> T) {
            Thread.detachNewThread { [self] in
                value = body()
                done.signal()
            }
        }
        func result(within seconds: Double = 30) -> T? { done.wait(timeout: .now() + seconds) == .success ? value : nil }
    }

    static func laCode(_ error: (any Error)?) -> LAError.Code? { (error as? LAError)?.code }

    static func readData(_ query: [String: Any]) -> (OSStatus, Data?) {
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        return (status, result as? Data)
    }

    /// With the emulator but no finger enrolled: biometry is there (touchID) but not enrolled, for
    /// canEvaluatePolicy and evaluatePolicy alike; an item of biometry alone cannot be read. Without any
    /// biometric authenticator (the suite's agent) it is not available.
    @Test(.enabled(if: biometryBuilt, "needs the built plugin host and biometric emulator"))
    func biometryNotEnrolledAndNotAvailable() async throws {
        let bio = try TestAgent(biometry: true)
        try await bio.serving {
            let context = LAContext()
            var error: NSError?
            #expect(!context.canEvaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, error: &error))
            #expect(error?.domain == LAErrorDomain)
            #expect(error?.code == LAError.Code.biometryNotEnrolled.rawValue)
            #expect(context.biometryType == .touchID, "the sensor is there")
            do {
                _ = try await context.evaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, localizedReason: "nothing enrolled")
                Issue.record("evaluated with nothing enrolled")
            } catch LAError.biometryNotEnrolled {
            } catch {
                Issue.record("\(error)")
            }
            // The device owner policy falls back to the passcode.
            #expect(context.canEvaluatePolicy(.deviceOwnerAuthentication, error: nil))

            let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .biometryAny, nil))
            let svc = service()
            #expect(SecItemAdd([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                kSecValueData as String: Data("fingers only".utf8), kSecAttrAccessControl as String: access] as CFDictionary, nil)
                    == errSecSuccess)
            let read = Self.readData([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc, kSecReturnData as String: true])
            #expect(read.0 == errSecNotAvailable, "biometry alone, nothing enrolled: LAErrorBiometryNotEnrolled as a keychain status")
            #expect(read.1 == nil)
            // A biometryCurrentSet item needs enrolled biometry when it is made.
            let current = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .biometryCurrentSet, nil))
            #expect(SecItemAdd([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc + "-current",
                                kSecValueData as String: Data("x".utf8), kSecAttrAccessControl as String: current] as CFDictionary, nil)
                    == errSecNotAvailable)
        }
        // The suite's agent has no biometric authenticator at all.
        let none = LAContext()
        var error: NSError?
        #expect(!none.canEvaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, error: &error))
        #expect(error?.code == LAError.Code.biometryNotAvailable.rawValue)
        #expect(none.biometryType == .none)
        do {
            _ = try await none.evaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, localizedReason: "no sensor")
            Issue.record("evaluated without a sensor")
        } catch LAError.biometryNotAvailable {
        } catch {
            Issue.record("\(error)")
        }
    }

    /// Apple's pattern: evaluate biometry with an LAContext, then read a .biometryAny item with the context in
    /// kSecUseAuthenticationContext — one touch for both. Without the context the read waits for its own touch;
    /// a finger that is not enrolled is refused.
    @Test(.enabled(if: biometryBuilt, "needs the built plugin host and biometric emulator"))
    func anEvaluatedBiometryContextReadsABiometryItem() async throws {
        let bio = try TestAgent(biometry: true)
        try bio.enroll("alice")
        try await bio.serving {
            let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .biometryAny, nil))
            let svc = service()
            #expect(SecItemAdd([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                kSecValueData as String: Data("fingers only".utf8), kSecAttrAccessControl as String: access] as CFDictionary, nil)
                    == errSecSuccess)

            let context = LAContext()
            var error: NSError?
            #expect(context.canEvaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, error: &error), "\(String(describing: error))")
            #expect(context.biometryType == .touchID)
            let pending = PendingEvaluation(context, .deviceOwnerAuthenticationWithBiometrics, reason: "Unlock with your finger")
            #expect(bio.touch("alice"), "no evaluation waited for a finger")
            let outcome = try #require(pending.result(), "the evaluation did not end")
            #expect((try? outcome.get()) == true, "\(outcome)")
            let state = try #require(context.evaluatedPolicyDomainState)
            #expect(state.count == 32 && state != Data(count: 32))

            let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                        kSecReturnData as String: true, kSecUseAuthenticationContext as String: context]
            let read = Self.readData(query)
            #expect(read.0 == errSecSuccess)
            #expect(read.1 == Data("fingers only".utf8), "the evaluation covered the read: no second touch")
            let again = Self.readData(query)
            #expect(again.0 == errSecSuccess, "and the next one, inside the reuse window")

            // Without the context the read asks for its own touch; an unknown finger is no match.
            var plain = query
            plain[kSecUseAuthenticationContext as String] = nil
            plain[kSecUseAuthenticationUI as String] = kSecUseAuthenticationUIFail
            #expect(Self.readData(plain).0 == errSecInteractionNotAllowed, "needs the person")
            plain[kSecUseAuthenticationUI as String] = nil
            nonisolated(unsafe) let waitingQuery = plain
            let waiting = Pending { Self.readData(waitingQuery) }
            #expect(bio.touch("alice"))
            #expect(waiting.result()?.1 == Data("fingers only".utf8))

            // A finger that is not enrolled is no match (the agent asks again, until its deadline); invalidating
            // the context ends the evaluation at once with appCancel, as Apple's invalidate does.
            let stranger = LAContext()
            let refused = PendingEvaluation(stranger, .deviceOwnerAuthenticationWithBiometrics, reason: "Not you")
            #expect(bio.touch(nil))
            #expect(bio.touch(nil), "asked again after the miss")
            let invalidatedAt = Date()
            stranger.invalidate()
            let failure = try #require(refused.result(), "the evaluation did not end")
            #expect(Date().timeIntervalSince(invalidatedAt) < 5)
            switch failure {
            case .success: Issue.record("an unknown finger was accepted")
            case .failure(let e): #expect(Self.laCode(e) == .appCancel, "\(e)")
            }
            #expect(Self.readData([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc, kSecReturnData as String: true,
                                   kSecUseAuthenticationContext as String: stranger]).0 == errSecAuthFailed,
                    "an invalidated context reads nothing and asks nobody")
        }
    }

    /// .biometryCurrentSet: an item bound to the enrolled fingers reads with an evaluated context while the set
    /// is the same; after another finger is enrolled it is refused even with a fresh evaluation (the domain
    /// state changed), while a .biometryAny item still reads.
    @Test(.enabled(if: biometryBuilt, "needs the built plugin host and biometric emulator"))
    func aCurrentSetItemFailsAfterTheEnrollmentChanges() async throws {
        let bio = try TestAgent(biometry: true)
        try bio.enroll("alice")
        try await bio.serving {
            let svc = service()
            for (suffix, flags) in [("current", SecAccessControlCreateFlags.biometryCurrentSet), ("any", .biometryAny)] {
                let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly, flags, nil))
                #expect(SecItemAdd([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc, kSecAttrAccount as String: suffix,
                                    kSecValueData as String: Data(suffix.utf8), kSecAttrAccessControl as String: access] as CFDictionary, nil)
                        == errSecSuccess)
            }
            func evaluated() throws -> LAContext {
                let context = LAContext()
                let pending = PendingEvaluation(context, .deviceOwnerAuthenticationWithBiometrics, reason: "Unlock")
                #expect(bio.touch("alice"))
                #expect((try? pending.result()?.get()) == true)
                return context
            }
            func read(_ account: String, _ context: LAContext) -> (OSStatus, Data?) {
                Self.readData([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc, kSecAttrAccount as String: account,
                               kSecReturnData as String: true, kSecUseAuthenticationContext as String: context])
            }
            let before = try evaluated()
            #expect(read("current", before).1 == Data("current".utf8))
            let stateBefore = before.evaluatedPolicyDomainState

            try bio.enroll("bob")
            let after = try evaluated()
            #expect(after.evaluatedPolicyDomainState != stateBefore, "the enrolled set's state changed")
            #expect(read("current", after).0 == errSecAuthFailed, "bound to the old set: refused")
            #expect(read("any", after).1 == Data("any".utf8), "biometryAny takes any enrolled finger")
        }
    }

    /// A key made in the agent that needs a finger to sign: found through an evaluated biometry context it signs
    /// with no second touch (a touch it did need would wait out the agent's 15 s and fail).
    @Test(.enabled(if: biometryBuilt, "needs the built plugin host and biometric emulator"))
    func anEvaluatedBiometryContextSignsWithABiometryKey() async throws {
        let bio = try TestAgent(biometry: true)
        try bio.enroll("alice")
        try await bio.serving {
            let (made, tag) = try agentKey(.biometryAny)
            let publicKey = try #require(SecKeyCopyPublicKey(made))
            let context = LAContext()
            let pending = PendingEvaluation(context, .deviceOwnerAuthenticationWithBiometrics, reason: "Sign with your finger")
            #expect(bio.touch("alice"))
            #expect((try? pending.result()?.get()) == true)
            let key = try findKey(tag, [kSecUseAuthenticationContext as String: context])
            let started = Date()
            #expect(sign(key, Data("payment 1".utf8), verifyingWith: publicKey).ok)
            #expect(sign(key, Data("payment 2".utf8), verifyingWith: publicKey).ok)
            #expect(Date().timeIntervalSince(started) < 5, "no touch was waited for")
            // Without the context the signature waits for a finger.
            let plain = try findKey(tag)
            let message = Data("payment 3".utf8)
            let waiting = Pending { [self] in sign(plain, message, verifyingWith: publicKey).ok }
            #expect(bio.touch("alice"))
            #expect(waiting.result() == true)
        }
    }
}
