/* gk-unlock: unlocks a running gnome-keyring-daemon's login keyring with the password on stdin,
 * through the daemon's control socket ($XDG_RUNTIME_DIR/keyring/control), the way
 * pam_gnome_keyring does at login (gkd_control_unlock in gnome-keyring's
 * daemon/control/gkd-control-client.c). Used by peers.sh to time "unlock with the password"
 * for gnome-keyring as a whole process, like `coffer unlock`. A C program so that no interpreter's
 * start-up is counted against gnome-keyring.
 *
 * Protocol: one zero byte (the credentials byte), then a packet: u32 length (of the whole packet),
 * u32 op (1 = unlock), u32 password length, password bytes; the reply is u32 length (8), u32 result
 * (0 ok, 1 denied, 2 failed, 3 no daemon). Integers are big-endian. Exit status: the result code.
 *
 *   cc -O2 -o gk-unlock gk-unlock.c && printf %s "$PASSWORD" | ./gk-unlock
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(void) {
    char pw[4096];
    size_t len = fread(pw, 1, sizeof pw, stdin);
    if (len > 0 && pw[len - 1] == '\n') len--; /* one trailing newline, as most tools drop */

    const char *runtime = getenv("XDG_RUNTIME_DIR");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!runtime || snprintf(addr.sun_path, sizeof addr.sun_path, "%s/keyring/control", runtime) >= (int)sizeof addr.sun_path) {
        fputs("gk-unlock: XDG_RUNTIME_DIR is not set or too long\n", stderr);
        return 3;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        perror("gk-unlock: connect");
        return 3;
    }
    unsigned char packet[12 + sizeof pw];
    uint32_t total = htonl((uint32_t)(12 + len)), op = htonl(1), plen = htonl((uint32_t)len);
    memcpy(packet, &total, 4);
    memcpy(packet + 4, &op, 4);
    memcpy(packet + 8, &plen, 4);
    memcpy(packet + 12, pw, len);
    unsigned char reply[8];
    size_t got = 0;
    if (write_all(fd, "", 1) != 0 || write_all(fd, packet, 12 + len) != 0) {
        perror("gk-unlock: write");
        return 2;
    }
    memset(pw, 0, sizeof pw);
    memset(packet, 0, sizeof packet);
    while (got < sizeof reply) {
        ssize_t r = read(fd, reply + got, sizeof reply - got);
        if (r <= 0) {
            fputs("gk-unlock: no reply from the daemon\n", stderr);
            return 2;
        }
        got += (size_t)r;
    }
    uint32_t result;
    memcpy(&result, reply + 4, 4);
    return (int)ntohl(result);
}
