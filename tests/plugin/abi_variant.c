/* Plugins that get the ABI wrong, one per DFLASH_ABI_VARIANT, for the refusal tests: the minimal
 * plugin's table with one thing broken (6 and 8: nothing broken, for the tests of what they announce). */
#define dflash_drafter_get_api minimal_get_api
#include "examples/plugin/minimal_plugin.c"
#undef dflash_drafter_get_api

#if DFLASH_ABI_VARIANT == 1 /* an ABI version the harness does not know */
#define BREAK(t) ((t).abi_version = 3u)
#elif DFLASH_ABI_VARIANT == 2 /* a table smaller than version 1's */
#define BREAK(t) ((t).struct_size = 24u)
#elif DFLASH_ABI_VARIANT == 3 /* no table at all */
#define BREAK(t) ((void)(t))
#define NULL_TABLE 1
#elif DFLASH_ABI_VARIANT == 4 /* taps announced without read_tap */
#define BREAK(t) ((t).capabilities |= DFLASH_CAP_TAPS)
#elif DFLASH_ABI_VARIANT == 6 /* nothing broken: a plugin of ABI version 1, which the harness still reads */
/* Version 1's create: head settings of DFLASH_HEAD_SETTINGS_V1_SIZE bytes, no tensor-parallel fields. */
static dflash_status create_v1(const dflash_create_args* args, dflash_drafter** out, char* message, size_t size) {
  dflash_create_args v2 = *args;
  dflash_head_settings head;
  if (args->head->struct_size != DFLASH_HEAD_SETTINGS_V1_SIZE)
    return fail(DFLASH_STATUS_UNSUPPORTED, message, size, "head settings are not ABI version 1's", "");
  memset(&head, 0, sizeof head);
  memcpy(&head, args->head, DFLASH_HEAD_SETTINGS_V1_SIZE);
  head.struct_size = sizeof head;
  head.tp_size = 1;
  v2.head = &head;
  return create(&v2, out, message, size);
}
#define BREAK(t) ((t).abi_version = 1u, (t).create = create_v1)
#elif DFLASH_ABI_VARIANT == 7 /* a version-2 capability in a version-1 table */
#define BREAK(t) ((t).abi_version = 1u, (t).capabilities |= DFLASH_CAP_BF16_ATTENTION_PARTIALS)
#elif DFLASH_ABI_VARIANT == 8 /* nothing broken: bf16 attention partials announced (version 2) */
#define BREAK(t) ((t).capabilities |= DFLASH_CAP_BF16_ATTENTION_PARTIALS)
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
