/* A stand-in PJRT plugin whose API major version is 99: rtpu must refuse it
 * with a message naming both versions. Only the leading fields of PJRT_Api
 * that rtpu reads before the version check are laid out here. */
#include <stddef.h>

struct fake_api_version {
  size_t struct_size;
  void *extension_start;
  int major_version;
  int minor_version;
};

struct fake_api {
  size_t struct_size;
  void *extension_start;
  struct fake_api_version pjrt_api_version;
};

static const struct fake_api api = {
    sizeof(struct fake_api), NULL, {sizeof(struct fake_api_version), NULL, 99, 7}};

const struct fake_api *GetPjrtApi(void);

const struct fake_api *GetPjrtApi(void) { return &api; }
