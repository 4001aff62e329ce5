/* Test client for CofferIdentityTests: connects to the Unix socket argv[1]; with argv[2] "exit" it
   exits at once, with "hold" it stays until the server closes the connection. Built static, so it
   also runs in a bare bwrap root. */
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) return 64;
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, argv[1], sizeof(a.sun_path) - 1);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) return 2;
    if (strcmp(argv[2], "exit") == 0) return 0;
    char c;
    while (read(s, &c, 1) > 0) {}
    return 0;
}
