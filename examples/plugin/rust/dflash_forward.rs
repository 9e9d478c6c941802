//! A drafter plugin written in Rust (docs/plugin.md, "Rust"): it exports dflash_drafter_get_api and
//! forwards to the plugin named by the environment variable DFLASH_FORWARD_TO, whose version-2 table
//! it returns under the name "rust-forward". It shows the extern "C" side of the ABI from Rust, and lets
//! CI check that a Rust cdylib can serve the table. Plain rustc (1.63 or later), no crates:
//!   rustc --edition 2021 --crate-type cdylib -O dflash_forward.rs
use std::cell::UnsafeCell;
use std::io::Write;
use std::mem::size_of;
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::sync::Once;

const ABI_VERSION: u32 = 2;
const NAME: &[u8] = b"rust-forward\0";

// The argument types the forwarder hands through without reading them (the header's structs).
#[repr(C)]
pub struct CreateArgs {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ProposeRequest {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ProposeResult {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct Drafter {
    _opaque: [u8; 0],
}

type Status = c_int; // dflash_status, a C enum: int-sized

// The entry points' types, in the header's order.
type CreateFn = unsafe extern "C" fn(*const CreateArgs, *mut *mut Drafter, *mut c_char, usize) -> Status;
type ProposeFn =
    unsafe extern "C" fn(*mut Drafter, *const ProposeRequest, *mut ProposeResult, usize, *mut c_char, usize) -> Status;
type ReleaseFn = unsafe extern "C" fn(*mut Drafter, i32, *mut c_char, usize) -> Status;
type DestroyFn = unsafe extern "C" fn(*mut Drafter);
type ReadTapFn = unsafe extern "C" fn(
    *mut Drafter,
    i32,
    *const c_char,
    *mut f32,
    usize,
    *mut i32,
    *mut i64,
    *mut c_char,
    usize,
) -> Status;
type ReadKvFn =
    unsafe extern "C" fn(*mut Drafter, i32, i32, *const i64, usize, *mut f32, *mut f32, *mut c_char, usize) -> Status;
type DescribeFn = unsafe extern "C" fn(*mut Drafter) -> *const c_char;

/// dflash_drafter_api of ABI version 2 (the table of version 1 too), field for field (a NULL entry point is None).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DrafterApi {
    pub abi_version: u32,
    pub struct_size: u32,
    pub capabilities: u64,
    pub name: *const c_char,
    pub create: Option<CreateFn>,
    pub propose: Option<ProposeFn>,
    pub release: Option<ReleaseFn>,
    pub destroy: Option<DestroyFn>,
    pub read_tap: Option<ReadTapFn>,
    pub read_kv: Option<ReadKvFn>,
    pub describe: Option<DescribeFn>,
}

type GetApi = unsafe extern "C" fn(u32) -> *const DrafterApi;

// The C library's dynamic loader (glibc: in libc itself since 2.34, before that in libdl, which the
// Rust standard library links on linux-gnu).
const RTLD_NOW: c_int = 2;
extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}

// The forwarded plugin's get_api (None when it could not be loaded), and the renamed copy of its
// version-2 table. Both are written once, under their Once, and only read afterwards.
struct Cell<T>(UnsafeCell<T>);
unsafe impl<T> Sync for Cell<T> {}
static LOAD: Once = Once::new();
static TARGET: Cell<Option<GetApi>> = Cell(UnsafeCell::new(None));
static COPY: Once = Once::new();
static TABLE: Cell<Option<DrafterApi>> = Cell(UnsafeCell::new(None));

fn complain(what: &str, detail: *const c_char) {
    let mut err = std::io::stderr();
    let _ = write!(err, "rust-forward: {}", what); // no panic across the C boundary
    if !detail.is_null() {
        let _ = err.write_all(unsafe { std::ffi::CStr::from_ptr(detail) }.to_bytes());
    }
    let _ = writeln!(err);
}

fn load() -> Option<GetApi> {
    let path = match std::env::var_os("DFLASH_FORWARD_TO") {
        Some(path) => path,
        None => {
            complain(
                "DFLASH_FORWARD_TO is not set (the plugin to forward to)",
                std::ptr::null(),
            );
            return None;
        }
    };
    let path = match std::ffi::CString::new(path.as_bytes()) {
        Ok(path) => path,
        Err(_) => {
            complain("DFLASH_FORWARD_TO holds a NUL byte", std::ptr::null());
            return None;
        }
    };
    unsafe {
        let handle = dlopen(path.as_ptr(), RTLD_NOW);
        if handle.is_null() {
            complain("cannot load DFLASH_FORWARD_TO: ", dlerror());
            return None;
        }
        let symbol = dlsym(handle, b"dflash_drafter_get_api\0".as_ptr() as *const c_char);
        if symbol.is_null() {
            complain("DFLASH_FORWARD_TO has no dflash_drafter_get_api: ", dlerror());
            return None;
        }
        Some(std::mem::transmute::<*mut c_void, GetApi>(symbol))
    }
}

/// The forwarded plugin's answer to `abi_version`: its version-2 table copied and renamed, or, when
/// it answers with another version (or a table of another size), that table untouched, so the
/// harness sees the version the plugin implements and refuses it by name.
#[no_mangle]
pub extern "C" fn dflash_drafter_get_api(abi_version: u32) -> *const DrafterApi {
    unsafe {
        LOAD.call_once(|| *TARGET.0.get() = load());
        let get_api = match *TARGET.0.get() {
            Some(get_api) => get_api,
            None => return std::ptr::null(),
        };
        let theirs = get_api(abi_version);
        if theirs.is_null()
            || (*theirs).abi_version != ABI_VERSION
            || (*theirs).struct_size as usize != size_of::<DrafterApi>()
        {
            return theirs;
        }
        COPY.call_once(|| {
            let mut table = *theirs;
            table.name = NAME.as_ptr() as *const c_char;
            *TABLE.0.get() = Some(table);
        });
        match &*TABLE.0.get() {
            Some(table) => table as *const DrafterApi,
            None => std::ptr::null(),
        }
    }
}
