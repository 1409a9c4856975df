/* The datagram helper's interface version: the one number both sides read. _dgram.c exports
 * it as _dgram.ABI; dgram.py reads this file at import and uses a built helper only when the
 * two agree. Bump it with any change to the module's functions, their arguments or what they
 * return: a helper built before the change (an in-place build not redone) then exports the
 * old number, and the Python datagram path runs instead of a call into a stale helper. */
#ifndef POLYCAST_DGRAM_ABI_H
#define POLYCAST_DGRAM_ABI_H

#define DGRAM_ABI 1

#endif
