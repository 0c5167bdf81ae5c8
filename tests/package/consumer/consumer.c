/* C consumer of an installed flashspan through pkg-config: the C ABI alone (flashspan.h). Builds
 * a plan on CPU tensors and checks a broken call reports a status and a message naming the argument. */
#include <stdio.h>
#include <string.h>

#include <flashspan/flashspan.h>

int main(void) {
  float q[1 * 8 * 1 * 8] = {0};
  int32_t mask[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const int64_t qs[4] = {1, 8, 1, 8}, ms[3] = {1, 1, 8};
  fs_tensor_t tq = {q, {FS_DEVICE_CPU, 0}, 4, {FS_DTYPE_FLOAT, 32, 1}, qs, NULL, 0};
  fs_tensor_t tm = {mask, {FS_DEVICE_CPU, 0}, 3, {FS_DTYPE_INT, 32, 1}, ms, NULL, 0};
  fs_mask_plan_args_t a;
  memset(&a, 0, sizeof a);
  a.mask_func = &tm;
  a.q = &tq;
  a.k = &tq;
  a.v = &tq;
  a.pack_gqa = -1;
  fs_mask_plan_t plan = NULL;
  if (fs_create_mask_plan(&a, &plan) != FS_STATUS_SUCCESS) {
    fprintf(stderr, "fs_create_mask_plan: %s\n", fs_get_last_error());
    return 1;
  }
  fs_mask_plan_info_t info;
  if (fs_mask_plan_get_info(plan, &info) != FS_STATUS_SUCCESS || info.visible_pairs != 36) {
    fprintf(stderr, "plan info: %s\n", fs_get_last_error());
    return 1;
  }
  fs_mask_plan_destroy(plan);
  a.pack_gqa = 7;
  if (fs_create_mask_plan(&a, &plan) != FS_STATUS_INVALID_ARGUMENT || strstr(fs_get_last_error(), "pack_gqa:") == NULL) {
    fprintf(stderr, "expected a pack_gqa error, got: %s\n", fs_get_last_error());
    return 1;
  }
  printf("C consumer: flashspan %s (ABI %d), plan with %lld visible pairs OK\n", fs_version(), fs_abi_version(),
         (long long)info.visible_pairs);
  return 0;
}
