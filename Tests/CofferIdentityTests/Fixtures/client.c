/* Test client for CofferIdentityTests: connects to the Unix socket argv[1]; with argv[2] "exit" it
   exits at once, with "hold" it stays until the server closes the connection, with "zombie" a child
   connects and exits while this process holds the socket unreaped, with "session" a child makes a
   new session (setsid: it is the session's leader; this process, a process group leader, could not)
   and holds, while this process waits for it, with "exec" it waits for one byte from the server, then
   execs /bin/sh reading the connection (the same process, another executable), which exits when the
   server closes it. Built static, so it also runs in a bare bwrap root. */
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) return 64;
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, argv[1], sizeof(a.sun_path) - 1);
    if (strcmp(argv[2], "zombie") == 0) {
        /* A child connects and exits at once; this process keeps the socket and never reaps it. */
        pid_t child = fork();
        if (child < 0) return 3;
        if (child == 0) _exit(connect(s, (struct sockaddr *)&a, sizeof a) == 0 ? 0 : 2);
        char c;
        while (read(s, &c, 1) > 0) {}
        return 0;
    }
    if (strcmp(argv[2], "session") == 0) {
        pid_t child = fork();
        if (child < 0) return 3;
        if (child > 0) {
            int status = 0;
            if (waitpid(child, &status, 0) != child) return 3;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 5;
        }
        if (setsid() < 0) _exit(4);
    }
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) return 2;
    if (strcmp(argv[2], "exit") == 0) return 0;
    if (strcmp(argv[2], "exec") == 0) {
        char go;
        if (read(s, &go, 1) != 1 || dup2(s, 0) != 0) return 6;
        execl("/bin/sh", "sh", "-c", "while read x; do :; done", (char *)0);
        return 7;
    }
    char c;
    while (read(s, &c, 1) > 0) {}
    return 0;
}
