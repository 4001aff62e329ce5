import CofferSystem
import Testing

/// Which passed fd is which socket (LISTEN_FDS from fd 3, LISTEN_FDNAMES as the units'
/// FileDescriptorName= set them); the end-to-end tests pass real sockets with systemd-socket-activate.
@Suite struct ActivationSocketsTests {
    typealias Sockets = Systemd.ActivationSockets

    @Test func namedSocketsGoToTheirRolesInAnyOrder() {
        #expect(Systemd.assign(count: 2, names: ["agent", "ssh-agent"], firstFD: 3) == Sockets(native: 3, sshAgent: 4))
        #expect(Systemd.assign(count: 2, names: ["ssh-agent", "agent"], firstFD: 3) == Sockets(native: 4, sshAgent: 3))
        // A unit without FileDescriptorName=: systemd names the fd after the unit.
        #expect(Systemd.assign(count: 2, names: ["coffer-agent.socket", "coffer-ssh-agent.socket"], firstFD: 3) == Sockets(native: 3, sshAgent: 4))
        // Only the ssh-agent socket: the agent makes its native socket itself.
        #expect(Systemd.assign(count: 1, names: ["ssh-agent"], firstFD: 3) == Sockets(native: nil, sshAgent: 3))
    }

    @Test func aSingleOrUnnamedSocketIsTheNativeOneAsBefore() {
        #expect(Systemd.assign(count: 1, names: nil, firstFD: 3) == Sockets(native: 3, sshAgent: nil))
        #expect(Systemd.assign(count: 1, names: ["agent"], firstFD: 3) == Sockets(native: 3, sshAgent: nil))
        #expect(Systemd.assign(count: 1, names: ["unknown"], firstFD: 3) == Sockets(native: 3, sshAgent: nil))
        // Fds with no role are left over (and closed); names that do not match the count are ignored.
        #expect(Systemd.assign(count: 2, names: nil, firstFD: 3) == Sockets(native: 3, sshAgent: nil, unused: [4]))
        #expect(Systemd.assign(count: 2, names: ["ssh-agent"], firstFD: 3) == Sockets(native: 3, sshAgent: nil, unused: [4]))
        #expect(Systemd.assign(count: 3, names: ["other", "ssh-agent", "agent"], firstFD: 3) == Sockets(native: 5, sshAgent: 4, unused: [3]))
    }
}
