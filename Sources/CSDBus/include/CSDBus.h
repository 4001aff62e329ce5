/*
 * CSDBus: Coffer's one C wall over sd-bus from libsystemd (linked with -lsystemd). It holds three
 * walls, one header and one .c file each, and their users:
 *
 *   CSecretServiceBus.h (csecretservicebus.c, ssb_*)  the Secret Service front end's objects on the
 *                                                     bus, for CofferSecretService;
 *   CSecretServiceClient.h (client.c, ssc_*)          another Secret Service provider as a client,
 *                                                     for CofferSecretServiceImport;
 *   CSecretServicePortal.h (portal.c, csp_*)          the desktop portal's secret backend, for
 *                                                     CofferSecretPortal.
 *
 * The wall's rule: sd-bus's readers and writers take C varargs, which Swift cannot call, so each
 * function here reads or writes one fixed message signature. What is written in C is only calls
 * into sd-bus and the copying around them: all marshalling is sd-bus's, nothing here parses D-Bus
 * bytes, and no decision is taken here (whom to answer, what to refuse is the Swift side's). Each
 * Swift module calls only its own wall's functions (CofferArchitectureTests checks the prefixes).
 */
#ifndef CSDBUS_H
#define CSDBUS_H

#include "CSecretServiceBus.h"
#include "CSecretServiceClient.h"
#include "CSecretServicePortal.h"

#endif
