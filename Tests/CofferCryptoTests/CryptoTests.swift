@testable import CofferCrypto
import Glibc
import Testing

@Suite struct SecureBytesTests {
    @Test func randomBuffersDifferAndCompareInConstantTime() {
        let a = SecureBytes.random(count: 32)
        let b = SecureBytes.random(count: 32)
        #expect(a.count == 32)
        #expect(!a.constantTimeEquals(b))
        let c = a.withUnsafeBytes { SecureBytes(copying: $0) }
        #expect(a.constantTimeEquals(c))
        #expect(!a.constantTimeEquals(SecureBytes(count: 31)))
    }

    @Test func consumingWipesTheSourceArray() {
        var source: [UInt8] = Array("hunter2".utf8)
        let s = SecureBytes(consuming: &source)
        #expect(source.isEmpty)
        #expect(s.withUnsafeBytes { Array($0) } == Array("hunter2".utf8))
    }

    @Test func wipeZeroesAndLiveCountTracksReleases() {
        // The live count is process-wide and other suites allocate and release in parallel, so one
        // reading can be off by their releases: the allocation must show in at least one of a few
        // tries (a counter that never counts fails them all).
        var counted = false
        for _ in 0..<20 where !counted {
            let before = SecureMemory.liveAllocations
            let s = SecureBytes.random(count: 64)
            counted = SecureMemory.liveAllocations >= before + 1
            s.wipe()
            #expect(s.withUnsafeBytes { $0.allSatisfy { $0 == 0 } })
        }
        #expect(counted, "allocating a SecureBytes never raised the live count")
        #expect(SecureMemory.lockedBytes() != nil)
    }

    @Test func lockedMemoryNeverExceedsTheBudget() throws {
        // Ask for more guarded memory than RLIMIT_MEMLOCK allows (as root the kernel would lock it all).
        let budget = try #require(SecureMemory.lockBudget, "RLIMIT_MEMLOCK is unlimited here; nothing to check")
        let unlockedBefore = SecureMemory.unlockedAllocations
        let chunk = 256 << 10
        var held: [SecureBytes] = []
        for i in 0..<(budget / chunk + 8) {
            let s = SecureBytes(count: chunk)
            #expect(s.withUnsafeBytes { $0.allSatisfy { $0 == 0 } }, "a new buffer is not zeroed")
            s.withUnsafeMutableBytes { $0.storeBytes(of: UInt64(i), toByteOffset: chunk - 8, as: UInt64.self) }
            held.append(s)
            #expect(try #require(SecureMemory.lockedBytes()) <= budget)
        }
        #expect(SecureMemory.unlockedAllocations > unlockedBefore, "past the budget, buffers must be served unlocked (and counted)")
        for (i, s) in held.enumerated() {
            #expect(s.withUnsafeBytes { $0.load(fromByteOffset: chunk - 8, as: UInt64.self) } == UInt64(i))
        }
        held.removeAll()
        // Released budget is reusable: a new large buffer is locked again.
        let again = SecureMemory.unlockedAllocations
        _ = SecureBytes(count: chunk)
        #expect(SecureMemory.unlockedAllocations == again)
    }

    @Test func secureZeroWipesArrays() {
        var a: [UInt8] = [1, 2, 3]
        secureZero(&a)
        #expect(a == [0, 0, 0])
    }
}

@Suite struct AEADTests {
    let key = SecureBytes.random(count: AEAD.keyBytes)

    @Test func roundTripAndRandomNonce() throws {
        let msg = Array("attack at dawn".utf8)
        let sealed1 = msg.withUnsafeBytes { m in key.withUnsafeBytes { AEAD.seal(m, key: $0, ad: [1]) } }
        let sealed2 = msg.withUnsafeBytes { m in key.withUnsafeBytes { AEAD.seal(m, key: $0, ad: [1]) } }
        #expect(sealed1 != sealed2)
        #expect(sealed1.count == msg.count + AEAD.overhead)
        let opened = try AEAD.open(sealed1[...], key: key, ad: [1])
        #expect(opened.withUnsafeBytes { Array($0) } == msg)
    }

    @Test func everyFlippedBitFailsAuthentication() {
        let sealed = [UInt8](repeating: 7, count: 5).withUnsafeBytes { m in key.withUnsafeBytes { AEAD.seal(m, key: $0, ad: []) } }
        for i in sealed.indices {
            var bad = sealed
            bad[i] ^= 0x01
            #expect(throws: CryptoError.authenticationFailed) { try AEAD.open(bad[...], key: key, ad: []) }
        }
    }

    @Test func wrongAssociatedDataOrKeyFails() {
        let sealed = [UInt8](repeating: 7, count: 5).withUnsafeBytes { m in key.withUnsafeBytes { AEAD.seal(m, key: $0, ad: [1]) } }
        #expect(throws: CryptoError.authenticationFailed) { try AEAD.open(sealed[...], key: key, ad: [2]) }
        #expect(throws: CryptoError.authenticationFailed) { try AEAD.open(sealed[...], key: SecureBytes.random(count: 32), ad: [1]) }
        #expect(throws: CryptoError.malformedInput) { try AEAD.open(sealed[..<10], key: key, ad: [1]) }
    }
}

@Suite struct KDFAndHashTests {
    @Test func argon2idIsDeterministicPerSalt() throws {
        let pw = Array("correct horse".utf8)
        let salt = [UInt8](repeating: 1, count: Argon2id.saltBytes)
        let a = try pw.withUnsafeBytes { try Argon2id.deriveKey(password: $0, salt: salt, opsLimit: 1, memLimit: 8 << 20) }
        let b = try pw.withUnsafeBytes { try Argon2id.deriveKey(password: $0, salt: salt, opsLimit: 1, memLimit: 8 << 20) }
        let c = try pw.withUnsafeBytes {
            try Argon2id.deriveKey(password: $0, salt: [UInt8](repeating: 2, count: Argon2id.saltBytes), opsLimit: 1, memLimit: 8 << 20)
        }
        #expect(a.constantTimeEquals(b))
        #expect(!a.constantTimeEquals(c))
        #expect(throws: CryptoError.malformedInput) {
            try pw.withUnsafeBytes { try Argon2id.deriveKey(password: $0, salt: [1], opsLimit: 1, memLimit: 8 << 20) }
        }
    }

    @Test func keyedHashDependsOnKeyAndEveryPart() {
        let k1 = [UInt8](repeating: 1, count: 32), k2 = [UInt8](repeating: 2, count: 32)
        let h = { (k: [UInt8], parts: [[UInt8]]) in k.withUnsafeBytes { KeyedHash.hash(key: $0, parts: parts, outputBytes: 16) } }
        #expect(h(k1, [[1], [2]]) == h(k1, [[1], [2]]))
        #expect(h(k1, [[1], [2]]) == h(k1, [[1, 2]])) // concatenation: callers add separators
        #expect(h(k1, [[1], [2]]) != h(k2, [[1], [2]]))
        #expect(h(k1, [[1], [3]]) != h(k1, [[1], [2]]))
        #expect(h(k1, []).count == 16)
    }

    @Test func ed25519SignsAndRejectsTampering() {
        let (pk, sk) = Ed25519.generateKeyPair()
        let msg = Array("manifest".utf8)
        let sig = Ed25519.sign(msg, secretKey: sk)
        #expect(Ed25519.verify(signature: sig, message: msg, publicKey: pk))
        #expect(!Ed25519.verify(signature: sig, message: msg + [0], publicKey: pk))
        var bad = sig
        bad[0] ^= 1
        #expect(!Ed25519.verify(signature: bad, message: msg, publicKey: pk))
        #expect(!Ed25519.verify(signature: [1, 2], message: msg, publicKey: pk))
    }
}

@Suite struct SecurePoolTests {
    @Test func releasedChunksComeBackWiped() {
        for size in [1, 64, 200, 1000, 4096, 5000] {
            do {
                let s = SecureBytes(count: size)
                s.withUnsafeMutableBytes { for i in $0.indices { $0[i] = 0xAB } }
            }
            // LIFO reuse: the next buffer of the class is very likely the same chunk; it must be zero.
            let t = SecureBytes(count: size)
            #expect(t.withUnsafeBytes { $0.allSatisfy { $0 == 0 } }, "size \(size)")
        }
    }

    @Test func beyondThePoolCapBuffersStillWork() {
        // At most 2 MiB of chunks are pooled (512 of 4096 bytes); hold more than that at once.
        let many = (0..<(SecurePool.maximumPooledBytes / 4096 + 50)).map { i in
            let s = SecureBytes(count: 3000)
            s.withUnsafeMutableBytes { $0[0] = UInt8(truncatingIfNeeded: i) }
            return s
        }
        #expect(many.enumerated().allSatisfy { i, s in s.withUnsafeBytes { $0[0] } == UInt8(truncatingIfNeeded: i) })
        #expect(SecureMemory.liveAllocations >= many.count)
    }

    /// Chunks of every size class come from one locked arena, a page per class: a short-lived
    /// client that needs buffers of three sizes (the git helper: git's request, the agent's reply,
    /// the secret) locks one region, not one per size. Later arenas are larger, and the pool stops
    /// at its cap. (A pool state of its own, with arenas from malloc, so that the process's own
    /// pool, shared with the other tests, is not disturbed.)
    @Test func everySizeClassSharesOneArena() {
        var made: [(UnsafeMutableRawPointer, Int)] = []
        defer { for (p, _) in made { free(p) } }
        var pool = SecurePool.State()
        func take(_ ci: Int) -> UnsafeMutableRawPointer? {
            pool.take(ci) { bytes in
                guard let p = malloc(bytes) else { return nil }
                made.append((p, bytes))
                return p
            }
        }
        var taken: [(UnsafeMutableRawPointer, Int)] = []
        for ci in SecurePool.chunkSizes.indices {
            guard let p = take(ci) else { Issue.record("no chunk of class \(ci)"); return }
            taken.append((p, SecurePool.chunkSizes[ci]))
        }
        #expect(made.count == 1 && made.first?.1 == SecurePool.firstArenaBytes, "arenas: \(made.map(\.1))")
        // Each chunk lies inside the arena, and no two overlap.
        let arena = UInt(bitPattern: made[0].0)
        for (p, size) in taken {
            let a = UInt(bitPattern: p)
            #expect(a >= arena && a + UInt(size) <= arena + UInt(SecurePool.firstArenaBytes))
        }
        let spans = taken.map { (UInt(bitPattern: $0.0), UInt(bitPattern: $0.0) + UInt($0.1)) }.sorted { $0.0 < $1.0 }
        #expect(zip(spans, spans.dropFirst()).allSatisfy { $0.1 <= $1.0 })
        // The rest of the 64-byte class's page: still the one arena.
        for _ in 1..<(SecurePool.refillBytes / 64) { _ = take(0) }
        #expect(made.count == 1)
        // The first arena used up (a page for each class), the next page is a larger arena's; then
        // arenas up to the cap, and no further.
        _ = take(0)
        #expect(made.map(\.1) == [SecurePool.firstArenaBytes, SecurePool.arenaBytes], "arenas: \(made.map(\.1))")
        while take(3) != nil {}
        #expect(pool.pooled <= SecurePool.maximumPooledBytes && pool.pooled + SecurePool.arenaBytes > SecurePool.maximumPooledBytes)
        #expect(made.reduce(0) { $0 + $1.1 } == pool.pooled)
    }
}
