/// The part of Flatpak's `/.flatpak-info` (a GLib key file written by `flatpak run` into every
/// sandbox) that identity needs: the `name` key of the `[Application]` group.
package enum FlatpakInfo {
    /// Largest `.flatpak-info` read (64 KiB; real ones are a few hundred bytes).
    package static let maximumBytes = 64 << 10
    /// Longest application id (Flatpak's own limit).
    package static let maximumAppIDBytes = 255

    /// The app id of an `[Application]` group's `name=` key, nil if there is none or it is not a
    /// valid Flatpak application id. A runtime's file (`[Runtime]` only) has no app id.
    package static func appID(from bytes: [UInt8]) -> String? {
        guard bytes.count <= maximumBytes, let text = String(validating: bytes, as: UTF8.self) else { return nil }
        var group: Substring?
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = rawLine.trimmingWhitespace()
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { return nil }
                group = line.dropFirst().dropLast()
                continue
            }
            guard group == "Application", let eq = line.firstIndex(of: "=") else { continue }
            guard line[..<eq].trimmingWhitespace() == "name" else { continue }
            let value = String(line[line.index(after: eq)...].trimmingWhitespace())
            return isValidAppID(value) ? value : nil
        }
        return nil
    }

    /// Flatpak's rule for application ids: 3 or more dot-separated elements of `[A-Za-z0-9_-]`, none
    /// empty or starting with a digit, at most 255 bytes.
    package static func isValidAppID(_ id: String) -> Bool {
        guard !id.isEmpty, id.utf8.count <= maximumAppIDBytes else { return false }
        let elements = id.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard elements.count >= 3 else { return false }
        for e in elements {
            guard let first = e.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else { return false }
            for c in e {
                let ok = (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || c == UInt8(ascii: "_") || c == UInt8(ascii: "-")
                guard ok else { return false }
            }
        }
        return true
    }
}

extension Substring {
    fileprivate func trimmingWhitespace() -> Substring {
        var s = self
        while let f = s.first, f == " " || f == "\t" || f == "\r" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" || l == "\r" { s = s.dropLast() }
        return s
    }
}
