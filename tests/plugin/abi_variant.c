/* Plugins that get the ABI wrong, one per DFLASH_ABI_VARIANT, for the refusal tests: the minimal
 * plugin's table with one thing broken. */
#define dflash_drafter_get_api minimal_get_api
#include "examples/plugin/minimal_plugin.c"
#undef dflash_drafter_get_api

#if DFLASH_ABI_VARIANT == 1 /* another ABI version */
#define BREAK(t) ((t).abi_version = 2u)
#elif DFLASH_ABI_VARIANT == 2 /* a table smaller than version 1's */
#define BREAK(t) ((t).struct_size = 24u)
#elif DFLASH_ABI_VARIANT == 3 /* no table at all */
#define BREAK(t) ((void)(t))
#define NULL_TABLE 1
#elif DFLASH_ABI_VARIANT == 4 /* taps announced without read_tap */
#define BREAK(t) ((t).capabilities |= DFLASH_CAP_TAPS)
#endif

#if DFLASH_ABI_VARIANT == 5 /* the entry point under another name */
EXPORT const dflash_drafter_api* dflash_drafter_get_api_v1(uint32_t abi_version) { return minimal_get_api(abi_version); }
#else
EXPORT const dflash_drafter_api* dflash_drafter_get_api(uint32_t abi_version) {
  static dflash_drafter_api table;
  table = *minimal_get_api(abi_version);
  BREAK(table);
#ifdef NULL_TABLE
  return 0;
#else
  return &table;
#endif
}
#endif
