import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// Reading a call's arguments and writing its reply through the sd-bus wall (CSecretServiceBus.h in CSDBus).
extension SecretServiceFrontEnd {
    // MARK: Reading and replying

    static func strings(_ strv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> [String] {
        guard let strv else { return [] }
        var out: [String] = []
        var i = 0
        while let s = strv[i] {
            out.append(String(cString: s))
            i += 1
        }
        return out
    }

    static func readString(_ m: OpaquePointer?, _ type: CChar = CChar(UInt8(ascii: "s"))) throws(BusError) -> String {
        var s: UnsafePointer<CChar>?
        guard ssb_read_string(m, type, &s) >= 0, let s else { throw BusError(name: BusError.invalidArgs, message: "bad arguments") }
        return String(cString: s)
    }

    static func readPaths(_ m: OpaquePointer?) throws(BusError) -> [String] {
        var strv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        guard ssb_read_strings(m, CChar(UInt8(ascii: "o")), &strv) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad arguments") }
        defer { ssb_strv_free(strv) }
        return strings(strv)
    }

    static func dictionary(_ pairs: [String]) -> [String: String] {
        var out: [String: String] = [:]
        var i = 0
        while i + 1 < pairs.count {
            out[pairs[i]] = pairs[i + 1]
            i += 2
        }
        return out
    }

    static func readDictionary(_ m: OpaquePointer?) throws(BusError) -> [String: String] {
        var strv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        guard ssb_read_string_dict(m, &strv) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad arguments") }
        defer { ssb_strv_free(strv) }
        return dictionary(strings(strv))
    }

    /// Replies with `body` appending to a new reply.
    func replyWith(_ m: OpaquePointer?, _ body: (OpaquePointer?) -> Int32) -> Int32 {
        var r: OpaquePointer?
        var rc = ssb_new_reply(m, &r)
        guard rc >= 0 else { return rc }
        rc = body(r)
        guard rc >= 0 else {
            ssb_release(r)
            return rc
        }
        return ssb_send(r)
    }

    static func appendStrings(_ m: OpaquePointer?, _ type: Character, _ items: [String]) -> Int32 {
        let cs = items.map { strdup($0) }
        defer { cs.forEach { free($0) } }
        return cs.map { UnsafePointer($0) }.withUnsafeBufferPointer { ssb_append_strings(m, CChar(type.asciiValue!), $0.baseAddress, $0.count) }
    }

    static func appendDictionary(_ m: OpaquePointer?, _ d: [String: String]) -> Int32 {
        let sorted = d.sorted { $0.key < $1.key }
        let keys = sorted.map { strdup($0.key) }, values = sorted.map { strdup($0.value) }
        defer { (keys + values).forEach { free($0) } }
        return keys.map { UnsafePointer($0) }.withUnsafeBufferPointer { k in
            values.map { UnsafePointer($0) }.withUnsafeBufferPointer { v in ssb_append_string_dict(m, k.baseAddress, v.baseAddress, k.count) }
        }
    }

    static func appendString(_ m: OpaquePointer?, _ type: Character, _ s: String) -> Int32 {
        ssb_append_string(m, CChar(type.asciiValue!), s)
    }

    func replyPaths(_ m: OpaquePointer?, _ a: [String], then b: String) -> Int32 {
        replyWith(m) { r in
            let rc = Self.appendStrings(r, "o", a)
            return rc < 0 ? rc : Self.appendString(r, "o", b)
        }
    }

    func replyPath(_ m: OpaquePointer?, _ a: String, _ b: String? = nil) -> Int32 {
        replyWith(m) { r in
            let rc = Self.appendString(r, "o", a)
            guard rc >= 0, let b else { return rc }
            return Self.appendString(r, "o", b)
        }
    }
}
