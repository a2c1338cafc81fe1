//! MPICH's ABI as `include/mpi.h` declares it: handle values, constants,
//! error classes and the status layout.

use std::os::raw::c_int;

pub type MPI_Comm = c_int;
pub type MPI_Datatype = c_int;
pub type MPI_Group = c_int;
pub type MPI_Op = c_int;
pub type MPI_Request = c_int;
pub type MPI_Errhandler = c_int;
pub type MPI_Info = c_int;
pub type MPI_Aint = libc::c_long;

/// `MPI_Status`, MPICH's layout: the byte count split in two words (the
/// top bit of the second is "cancelled").
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MPI_Status {
    pub count_lo: c_int,
    pub count_hi_and_cancelled: c_int,
    pub MPI_SOURCE: c_int,
    pub MPI_TAG: c_int,
    pub MPI_ERROR: c_int,
}

impl MPI_Status {
    pub fn set_count(&mut self, bytes: usize, cancelled: bool) {
        let b = bytes as u64;
        self.count_lo = b as u32 as c_int;
        self.count_hi_and_cancelled =
            ((b >> 32) as c_int & 0x7fff_ffff) | (cancelled as c_int) << 31;
    }
    pub fn count(&self) -> usize {
        (self.count_lo as u32 as usize)
            | (((self.count_hi_and_cancelled & 0x7fff_ffff) as usize) << 32)
    }
    pub fn cancelled(&self) -> bool {
        self.count_hi_and_cancelled < 0
    }
}

pub const MPI_COMM_NULL: MPI_Comm = 0x0400_0000;
pub const MPI_OP_NULL: MPI_Op = 0x1800_0000;
pub const MPI_GROUP_NULL: MPI_Group = 0x0800_0000;
pub const MPI_DATATYPE_NULL: MPI_Datatype = 0x0c00_0000;
pub const MPI_REQUEST_NULL: MPI_Request = 0x2c00_0000;
pub const MPI_ERRHANDLER_NULL: MPI_Errhandler = 0x1400_0000;
pub const MPI_INFO_NULL: MPI_Info = 0x1c00_0000;
pub const MPI_COMM_WORLD: MPI_Comm = 0x4400_0000;
pub const MPI_COMM_SELF: MPI_Comm = 0x4400_0001;
pub const MPI_GROUP_EMPTY: MPI_Group = 0x4800_0000;

/// Handles this library makes: a kind prefix and a table index.
pub const COMM_DYN: c_int = 0x8400_0000u32 as c_int;
pub const GROUP_DYN: c_int = 0x8800_0000u32 as c_int;
pub const TYPE_DYN: c_int = 0xcc00_0000u32 as c_int;
pub const OP_DYN: c_int = 0x9800_0000u32 as c_int;
pub const REQUEST_DYN: c_int = 0xac00_0000u32 as c_int;
pub const ERRH_DYN: c_int = 0x9400_0000u32 as c_int;
pub const INFO_DYN: c_int = 0x9c00_0000u32 as c_int;
pub const INDEX_MASK: c_int = 0x00ff_ffff;
pub const KIND_MASK: c_int = 0xff00_0000u32 as c_int;

pub const MPI_IDENT: c_int = 0;
pub const MPI_CONGRUENT: c_int = 1;
pub const MPI_SIMILAR: c_int = 2;
pub const MPI_UNEQUAL: c_int = 3;

pub const MPI_UNDEFINED: c_int = -32766;
pub const MPI_PROC_NULL: c_int = -1;
pub const MPI_ANY_SOURCE: c_int = -2;
pub const MPI_ROOT: c_int = -3;
pub const MPI_ANY_TAG: c_int = -1;
pub const MPI_IN_PLACE: usize = usize::MAX;
pub const MPI_STATUS_IGNORE: usize = 1;

pub const MPI_ERRORS_ARE_FATAL: MPI_Errhandler = 0x5400_0000;
pub const MPI_ERRORS_RETURN: MPI_Errhandler = 0x5400_0001;
pub const MPI_ERRORS_ABORT: MPI_Errhandler = 0x5400_0003;

pub const MPI_THREAD_SINGLE: c_int = 0;
pub const MPI_THREAD_FUNNELED: c_int = 1;

pub const MPI_TAG_UB: c_int = 0x6440_0001;
pub const MPI_HOST: c_int = 0x6440_0003;
pub const MPI_IO: c_int = 0x6440_0005;
pub const MPI_WTIME_IS_GLOBAL: c_int = 0x6440_0007;
pub const MPI_UNIVERSE_SIZE: c_int = 0x6440_0009;
pub const MPI_APPNUM: c_int = 0x6440_000d;

pub const MPI_MAX_PROCESSOR_NAME: usize = 128;
pub const MPI_MAX_ERROR_STRING: usize = 512;
pub const MPI_MAX_OBJECT_NAME: usize = 128;

// Error classes.
pub const MPI_SUCCESS: c_int = 0;
pub const MPI_ERR_BUFFER: c_int = 1;
pub const MPI_ERR_COUNT: c_int = 2;
pub const MPI_ERR_TYPE: c_int = 3;
pub const MPI_ERR_TAG: c_int = 4;
pub const MPI_ERR_COMM: c_int = 5;
pub const MPI_ERR_RANK: c_int = 6;
pub const MPI_ERR_ROOT: c_int = 7;
pub const MPI_ERR_GROUP: c_int = 8;
pub const MPI_ERR_OP: c_int = 9;
pub const MPI_ERR_ARG: c_int = 12;
pub const MPI_ERR_UNKNOWN: c_int = 13;
pub const MPI_ERR_TRUNCATE: c_int = 14;
pub const MPI_ERR_OTHER: c_int = 15;
pub const MPI_ERR_INTERN: c_int = 16;
pub const MPI_ERR_IN_STATUS: c_int = 17;
pub const MPI_ERR_PENDING: c_int = 18;
pub const MPI_ERR_REQUEST: c_int = 19;
pub const MPI_ERR_NO_MEM: c_int = 34;
pub const MPI_ERR_UNSUPPORTED_OPERATION: c_int = 44;
pub const MPI_ERR_PROC_ABORTED: c_int = 76;
/// Error codes are `class | (message slot << CODE_SHIFT)`: the slot keeps
/// the full message for `MPI_Error_string`.
pub const CODE_SHIFT: u32 = 7;

// Operations.
pub const MPI_MAX: MPI_Op = 0x5800_0001;
pub const MPI_MIN: MPI_Op = 0x5800_0002;
pub const MPI_SUM: MPI_Op = 0x5800_0003;
pub const MPI_PROD: MPI_Op = 0x5800_0004;
pub const MPI_LAND: MPI_Op = 0x5800_0005;
pub const MPI_BAND: MPI_Op = 0x5800_0006;
pub const MPI_LOR: MPI_Op = 0x5800_0007;
pub const MPI_BOR: MPI_Op = 0x5800_0008;
pub const MPI_LXOR: MPI_Op = 0x5800_0009;
pub const MPI_BXOR: MPI_Op = 0x5800_000a;
pub const MPI_MINLOC: MPI_Op = 0x5800_000b;
pub const MPI_MAXLOC: MPI_Op = 0x5800_000c;
pub const MPI_REPLACE: MPI_Op = 0x5800_000d;
pub const MPI_NO_OP: MPI_Op = 0x5800_000e;

// The predefined datatypes this library knows (see `datatype.rs`).
pub const MPI_CHAR: MPI_Datatype = 0x4c00_0101;
pub const MPI_SIGNED_CHAR: MPI_Datatype = 0x4c00_0118;
pub const MPI_UNSIGNED_CHAR: MPI_Datatype = 0x4c00_0102;
pub const MPI_BYTE: MPI_Datatype = 0x4c00_010d;
pub const MPI_WCHAR: MPI_Datatype = 0x4c00_040e;
pub const MPI_SHORT: MPI_Datatype = 0x4c00_0203;
pub const MPI_UNSIGNED_SHORT: MPI_Datatype = 0x4c00_0204;
pub const MPI_INT: MPI_Datatype = 0x4c00_0405;
pub const MPI_UNSIGNED: MPI_Datatype = 0x4c00_0406;
pub const MPI_LONG: MPI_Datatype = 0x4c00_0807;
pub const MPI_UNSIGNED_LONG: MPI_Datatype = 0x4c00_0808;
pub const MPI_FLOAT: MPI_Datatype = 0x4c00_040a;
pub const MPI_DOUBLE: MPI_Datatype = 0x4c00_080b;
pub const MPI_LONG_DOUBLE: MPI_Datatype = 0x4c00_100c;
pub const MPI_LONG_LONG_INT: MPI_Datatype = 0x4c00_0809;
pub const MPI_UNSIGNED_LONG_LONG: MPI_Datatype = 0x4c00_0819;
pub const MPI_PACKED: MPI_Datatype = 0x4c00_010f;
pub const MPI_FLOAT_INT: MPI_Datatype = 0x8c00_0000u32 as c_int;
pub const MPI_DOUBLE_INT: MPI_Datatype = 0x8c00_0001u32 as c_int;
pub const MPI_LONG_INT: MPI_Datatype = 0x8c00_0002u32 as c_int;
pub const MPI_SHORT_INT: MPI_Datatype = 0x8c00_0003u32 as c_int;
pub const MPI_2INT: MPI_Datatype = 0x4c00_0816;
pub const MPI_LONG_DOUBLE_INT: MPI_Datatype = 0x8c00_0004u32 as c_int;
pub const MPI_INT8_T: MPI_Datatype = 0x4c00_0137;
pub const MPI_INT16_T: MPI_Datatype = 0x4c00_0238;
pub const MPI_INT32_T: MPI_Datatype = 0x4c00_0439;
pub const MPI_INT64_T: MPI_Datatype = 0x4c00_083a;
pub const MPI_UINT8_T: MPI_Datatype = 0x4c00_013b;
pub const MPI_UINT16_T: MPI_Datatype = 0x4c00_023c;
pub const MPI_UINT32_T: MPI_Datatype = 0x4c00_043d;
pub const MPI_UINT64_T: MPI_Datatype = 0x4c00_083e;
pub const MPI_C_BOOL: MPI_Datatype = 0x4c00_013f;
pub const MPI_C_FLOAT_COMPLEX: MPI_Datatype = 0x4c00_0840;
pub const MPI_C_DOUBLE_COMPLEX: MPI_Datatype = 0x4c00_1041;
pub const MPI_C_LONG_DOUBLE_COMPLEX: MPI_Datatype = 0x4c00_2042;
pub const MPI_AINT: MPI_Datatype = 0x4c00_0843;
pub const MPI_OFFSET: MPI_Datatype = 0x4c00_0844;
pub const MPI_COUNT: MPI_Datatype = 0x4c00_0845;
pub const MPI_CXX_BOOL: MPI_Datatype = 0x4c00_0133;
pub const MPI_INTEGER: MPI_Datatype = 0x4c00_041b;
pub const MPI_REAL: MPI_Datatype = 0x4c00_041c;
pub const MPI_DOUBLE_PRECISION: MPI_Datatype = 0x4c00_081f;
pub const MPI_LOGICAL: MPI_Datatype = 0x4c00_041d;
pub const MPI_CHARACTER: MPI_Datatype = 0x4c00_011a;
