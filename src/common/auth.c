/*
 * auth.c -- authenticated mode's cluster secret: loading the key file, deriving the CURVE key pair and
 * the data-plane MAC key (pdlink/auth.h has the derivation; docs/security.md the threat model).
 *
 * Why libsodium: libzmq's CURVE already depends on it (Debian's libzmq5 links it), and it offers the
 * three primitives needed -- BLAKE2b key derivation, X25519 public keys, HMAC-SHA-256 with a
 * constant-time compare -- so nothing cryptographic is written here.
 */
#include "pdlink/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct pdl_auth {
    uint8_t curve_pk[PDL_AUTH_KEY_LEN];
    uint8_t curve_sk[PDL_AUTH_KEY_LEN];
    uint8_t data_key[crypto_auth_hmacsha256_KEYBYTES];
};

_Static_assert(crypto_auth_hmacsha256_BYTES == PDL_AUTH_KEY_LEN, "HMAC-SHA-256 is 32 bytes");
_Static_assert(crypto_scalarmult_BYTES == PDL_AUTH_KEY_LEN, "X25519 keys are 32 bytes");
_Static_assert(crypto_kdf_KEYBYTES == PDL_AUTH_KEY_LEN, "the KDF master key is 32 bytes");

/* Trailing white space (a final newline an editor adds) is not part of the secret. */
static size_t trim_len(const uint8_t *s, size_t n)
{
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    return n;
}

pdl_status_t pdl_auth_from_secret(const void *secret, size_t len, pdl_auth_t **out, pdl_error_t *err)
{
    if (secret == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "auth: no secret or no output");
    len = trim_len(secret, len);
    if (len < PDL_AUTH_SECRET_MIN || len > PDL_AUTH_SECRET_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "a secret of %zu bytes; %d to %d are needed (e.g. head -c 48 /dev/urandom | "
                             "base64 > key)",
                             len, PDL_AUTH_SECRET_MIN, PDL_AUTH_SECRET_MAX);
    if (sodium_init() < 0)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "auth: libsodium failed to initialise");
    pdl_auth_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "auth: out of memory");
    static const char domain[] = "pdlink auth v1";
    uint8_t master[crypto_kdf_KEYBYTES];
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, sizeof(master));
    crypto_generichash_update(&h, (const uint8_t *)domain, sizeof(domain) - 1);
    crypto_generichash_update(&h, secret, len);
    crypto_generichash_final(&h, master, sizeof(master));
    crypto_kdf_derive_from_key(a->curve_sk, sizeof(a->curve_sk), 1, "pdlcurve", master);
    crypto_kdf_derive_from_key(a->data_key, sizeof(a->data_key), 2, "pdl_data", master);
    crypto_scalarmult_base(a->curve_pk, a->curve_sk);
    sodium_memzero(master, sizeof(master));
    sodium_memzero(&h, sizeof(h));
    *out = a;
    return PDL_OK;
}

pdl_status_t pdl_auth_load(const char *path, pdl_auth_t **out, pdl_error_t *err)
{
    if (path == NULL || path[0] == '\0' || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "auth_key_file: no path given");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "auth_key_file %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int en = errno;
        close(fd);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "auth_key_file %s: fstat: %s", path, strerror(en));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return pdl_error_set(err, PDL_ERR_INVALID, "auth_key_file %s: not a regular file", path);
    }
    /* Anyone on the host who can read the secret can join the cluster, and a group is a set of users the
     * owner does not control: refuse any group or other bit, as ssh does for private keys. */
    if ((sb.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
        close(fd);
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "auth_key_file %s: mode %04o lets %s access it; only its owner may (chmod 600 %s)", path,
                             (unsigned)(sb.st_mode & 07777), (sb.st_mode & S_IRWXO) != 0 ? "every user" : "its group",
                             path);
    }
    uint8_t buf[PDL_AUTH_SECRET_MAX + 1];
    size_t n = 0;
    while (n < sizeof(buf)) {
        ssize_t k = read(fd, buf + n, sizeof(buf) - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int en = errno;
            close(fd);
            sodium_memzero(buf, sizeof(buf));
            return pdl_error_set(err, PDL_ERR_SYSTEM, "auth_key_file %s: read: %s", path, strerror(en));
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    pdl_status_t st = pdl_auth_from_secret(buf, n, out, err);
    sodium_memzero(buf, sizeof(buf));
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "auth_key_file %s", path);
    return PDL_OK;
}

void pdl_auth_free(pdl_auth_t *auth)
{
    if (auth == NULL)
        return;
    sodium_memzero(auth, sizeof(*auth));
    free(auth);
}

const uint8_t *pdl_auth_curve_public(const pdl_auth_t *auth) { return auth->curve_pk; }
const uint8_t *pdl_auth_curve_secret(const pdl_auth_t *auth) { return auth->curve_sk; }

void pdl_auth_mac(const pdl_auth_t *auth, const char *label, const void *const *parts, const size_t *lens, size_t n,
                  uint8_t out[PDL_AUTH_KEY_LEN])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, auth->data_key, sizeof(auth->data_key));
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label) + 1);
    for (size_t i = 0; i < n; i++) {
        /* Length-prefixed, so ("ab", "c") and ("a", "bc") are different inputs. */
        uint8_t len4[4] = {(uint8_t)lens[i], (uint8_t)(lens[i] >> 8), (uint8_t)(lens[i] >> 16), (uint8_t)(lens[i] >> 24)};
        crypto_auth_hmacsha256_update(&st, len4, sizeof(len4));
        if (lens[i] > 0)
            crypto_auth_hmacsha256_update(&st, parts[i], lens[i]);
    }
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof(st));
}

bool pdl_auth_verify(const pdl_auth_t *auth, const char *label, const void *const *parts, const size_t *lens,
                     size_t n, const uint8_t mac[PDL_AUTH_KEY_LEN])
{
    uint8_t want[PDL_AUTH_KEY_LEN];
    pdl_auth_mac(auth, label, parts, lens, n, want);
    bool ok = sodium_memcmp(want, mac, sizeof(want)) == 0;
    sodium_memzero(want, sizeof(want));
    return ok;
}

void pdl_auth_nonce(uint8_t out[PDL_AUTH_KEY_LEN])
{
    /* randombytes_buf needs sodium_init, which every pdl_auth_t's creation has run; a nonce is only
     * ever drawn for a handle, but initialising again costs one atomic check. */
    if (sodium_init() < 0)
        abort(); /* libsodium refuses to run without a random source: nothing secure can follow */
    randombytes_buf(out, PDL_AUTH_KEY_LEN);
}
