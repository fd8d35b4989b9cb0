//! NFSv4.1/4.2 numbers: operations, attributes and the flag words of RFC 8881 and RFC 7862
//! (the XDR of RFC 5662 and RFC 7863).

/// The NFSv4 program's only procedures (RFC 8881 §16.1, §16.2).
pub mod proc4 {
    pub const NULL: u32 = 0;
    pub const COMPOUND: u32 = 1;
}

/// `nfs_opnum4` (RFC 8881 §16.2.1, RFC 7862 §15).
pub mod op {
    pub const ACCESS: u32 = 3;
    pub const CLOSE: u32 = 4;
    pub const COMMIT: u32 = 5;
    pub const CREATE: u32 = 6;
    pub const DELEGPURGE: u32 = 7;
    pub const DELEGRETURN: u32 = 8;
    pub const GETATTR: u32 = 9;
    pub const GETFH: u32 = 10;
    pub const LINK: u32 = 11;
    pub const LOCK: u32 = 12;
    pub const LOCKT: u32 = 13;
    pub const LOCKU: u32 = 14;
    pub const LOOKUP: u32 = 15;
    pub const LOOKUPP: u32 = 16;
    pub const NVERIFY: u32 = 17;
    pub const OPEN: u32 = 18;
    pub const OPENATTR: u32 = 19;
    pub const OPEN_CONFIRM: u32 = 20;
    pub const OPEN_DOWNGRADE: u32 = 21;
    pub const PUTFH: u32 = 22;
    pub const PUTPUBFH: u32 = 23;
    pub const PUTROOTFH: u32 = 24;
    pub const READ: u32 = 25;
    pub const READDIR: u32 = 26;
    pub const READLINK: u32 = 27;
    pub const REMOVE: u32 = 28;
    pub const RENAME: u32 = 29;
    pub const RENEW: u32 = 30;
    pub const RESTOREFH: u32 = 31;
    pub const SAVEFH: u32 = 32;
    pub const SECINFO: u32 = 33;
    pub const SETATTR: u32 = 34;
    pub const SETCLIENTID: u32 = 35;
    pub const SETCLIENTID_CONFIRM: u32 = 36;
    pub const VERIFY: u32 = 37;
    pub const WRITE: u32 = 38;
    pub const RELEASE_LOCKOWNER: u32 = 39;
    pub const BACKCHANNEL_CTL: u32 = 40;
    pub const BIND_CONN_TO_SESSION: u32 = 41;
    pub const EXCHANGE_ID: u32 = 42;
    pub const CREATE_SESSION: u32 = 43;
    pub const DESTROY_SESSION: u32 = 44;
    pub const FREE_STATEID: u32 = 45;
    pub const GET_DIR_DELEGATION: u32 = 46;
    pub const GETDEVICEINFO: u32 = 47;
    pub const GETDEVICELIST: u32 = 48;
    pub const LAYOUTCOMMIT: u32 = 49;
    pub const LAYOUTGET: u32 = 50;
    pub const LAYOUTRETURN: u32 = 51;
    pub const SECINFO_NO_NAME: u32 = 52;
    pub const SEQUENCE: u32 = 53;
    pub const SET_SSV: u32 = 54;
    pub const TEST_STATEID: u32 = 55;
    pub const WANT_DELEGATION: u32 = 56;
    pub const DESTROY_CLIENTID: u32 = 57;
    pub const RECLAIM_COMPLETE: u32 = 58;
    // NFSv4.2 (RFC 7862 §15)
    pub const ALLOCATE: u32 = 59;
    pub const COPY: u32 = 60;
    pub const COPY_NOTIFY: u32 = 61;
    pub const DEALLOCATE: u32 = 62;
    pub const IO_ADVISE: u32 = 63;
    pub const LAYOUTERROR: u32 = 64;
    pub const LAYOUTSTATS: u32 = 65;
    pub const OFFLOAD_CANCEL: u32 = 66;
    pub const OFFLOAD_STATUS: u32 = 67;
    pub const READ_PLUS: u32 = 68;
    pub const SEEK: u32 = 69;
    pub const WRITE_SAME: u32 = 70;
    pub const CLONE: u32 = 71;
    // Extended attributes (RFC 8276)
    pub const GETXATTR: u32 = 72;
    pub const SETXATTR: u32 = 73;
    pub const LISTXATTRS: u32 = 74;
    pub const REMOVEXATTR: u32 = 75;
    pub const ILLEGAL: u32 = 10044;

    /// The highest operation number a minor version defines: 4.0 ends at RELEASE_LOCKOWNER
    /// (RFC 7530 §16), 4.1 at RECLAIM_COMPLETE, 4.2 at CLONE plus the RFC 8276
    /// extended-attribute operations.
    pub const fn last_for_minor(minor: u32) -> u32 {
        if minor >= 2 {
            REMOVEXATTR
        } else if minor == 1 {
            RECLAIM_COMPLETE
        } else {
            RELEASE_LOCKOWNER
        }
    }

    /// The operation's name as RFC 8881 spells it (for logs and the decoder).
    pub fn name(op: u32) -> &'static str {
        const NAMES: [&str; 76] = [
            "OP_0",
            "OP_1",
            "OP_2",
            "ACCESS",
            "CLOSE",
            "COMMIT",
            "CREATE",
            "DELEGPURGE",
            "DELEGRETURN",
            "GETATTR",
            "GETFH",
            "LINK",
            "LOCK",
            "LOCKT",
            "LOCKU",
            "LOOKUP",
            "LOOKUPP",
            "NVERIFY",
            "OPEN",
            "OPENATTR",
            "OPEN_CONFIRM",
            "OPEN_DOWNGRADE",
            "PUTFH",
            "PUTPUBFH",
            "PUTROOTFH",
            "READ",
            "READDIR",
            "READLINK",
            "REMOVE",
            "RENAME",
            "RENEW",
            "RESTOREFH",
            "SAVEFH",
            "SECINFO",
            "SETATTR",
            "SETCLIENTID",
            "SETCLIENTID_CONFIRM",
            "VERIFY",
            "WRITE",
            "RELEASE_LOCKOWNER",
            "BACKCHANNEL_CTL",
            "BIND_CONN_TO_SESSION",
            "EXCHANGE_ID",
            "CREATE_SESSION",
            "DESTROY_SESSION",
            "FREE_STATEID",
            "GET_DIR_DELEGATION",
            "GETDEVICEINFO",
            "GETDEVICELIST",
            "LAYOUTCOMMIT",
            "LAYOUTGET",
            "LAYOUTRETURN",
            "SECINFO_NO_NAME",
            "SEQUENCE",
            "SET_SSV",
            "TEST_STATEID",
            "WANT_DELEGATION",
            "DESTROY_CLIENTID",
            "RECLAIM_COMPLETE",
            "ALLOCATE",
            "COPY",
            "COPY_NOTIFY",
            "DEALLOCATE",
            "IO_ADVISE",
            "LAYOUTERROR",
            "LAYOUTSTATS",
            "OFFLOAD_CANCEL",
            "OFFLOAD_STATUS",
            "READ_PLUS",
            "SEEK",
            "WRITE_SAME",
            "CLONE",
            "GETXATTR",
            "SETXATTR",
            "LISTXATTRS",
            "REMOVEXATTR",
        ];
        match op {
            ILLEGAL => "ILLEGAL",
            n => NAMES.get(n as usize).copied().unwrap_or("UNKNOWN"),
        }
    }
}

/// Attribute numbers (RFC 8881 §5.8, RFC 7862 §12.2).
pub mod attr {
    pub const SUPPORTED_ATTRS: u32 = 0;
    pub const TYPE: u32 = 1;
    pub const FH_EXPIRE_TYPE: u32 = 2;
    pub const CHANGE: u32 = 3;
    pub const SIZE: u32 = 4;
    pub const LINK_SUPPORT: u32 = 5;
    pub const SYMLINK_SUPPORT: u32 = 6;
    pub const NAMED_ATTR: u32 = 7;
    pub const FSID: u32 = 8;
    pub const UNIQUE_HANDLES: u32 = 9;
    pub const LEASE_TIME: u32 = 10;
    pub const RDATTR_ERROR: u32 = 11;
    pub const ACL: u32 = 12;
    pub const ACLSUPPORT: u32 = 13;
    pub const ARCHIVE: u32 = 14;
    pub const CANSETTIME: u32 = 15;
    pub const CASE_INSENSITIVE: u32 = 16;
    pub const CASE_PRESERVING: u32 = 17;
    pub const CHOWN_RESTRICTED: u32 = 18;
    pub const FILEHANDLE: u32 = 19;
    pub const FILEID: u32 = 20;
    pub const FILES_AVAIL: u32 = 21;
    pub const FILES_FREE: u32 = 22;
    pub const FILES_TOTAL: u32 = 23;
    pub const FS_LOCATIONS: u32 = 24;
    pub const HIDDEN: u32 = 25;
    pub const HOMOGENEOUS: u32 = 26;
    pub const MAXFILESIZE: u32 = 27;
    pub const MAXLINK: u32 = 28;
    pub const MAXNAME: u32 = 29;
    pub const MAXREAD: u32 = 30;
    pub const MAXWRITE: u32 = 31;
    pub const MIMETYPE: u32 = 32;
    pub const MODE: u32 = 33;
    pub const NO_TRUNC: u32 = 34;
    pub const NUMLINKS: u32 = 35;
    pub const OWNER: u32 = 36;
    pub const OWNER_GROUP: u32 = 37;
    pub const QUOTA_AVAIL_HARD: u32 = 38;
    pub const QUOTA_AVAIL_SOFT: u32 = 39;
    pub const QUOTA_USED: u32 = 40;
    pub const RAWDEV: u32 = 41;
    pub const SPACE_AVAIL: u32 = 42;
    pub const SPACE_FREE: u32 = 43;
    pub const SPACE_TOTAL: u32 = 44;
    pub const SPACE_USED: u32 = 45;
    pub const SYSTEM: u32 = 46;
    pub const TIME_ACCESS: u32 = 47;
    pub const TIME_ACCESS_SET: u32 = 48;
    pub const TIME_BACKUP: u32 = 49;
    pub const TIME_CREATE: u32 = 50;
    pub const TIME_DELTA: u32 = 51;
    pub const TIME_METADATA: u32 = 52;
    pub const TIME_MODIFY: u32 = 53;
    pub const TIME_MODIFY_SET: u32 = 54;
    pub const MOUNTED_ON_FILEID: u32 = 55;
    pub const DIR_NOTIF_DELAY: u32 = 56;
    pub const DIRENT_NOTIF_DELAY: u32 = 57;
    pub const DACL: u32 = 58;
    pub const SACL: u32 = 59;
    pub const CHANGE_POLICY: u32 = 60;
    pub const FS_STATUS: u32 = 61;
    pub const FS_LAYOUT_TYPES: u32 = 62;
    pub const LAYOUT_HINT: u32 = 63;
    pub const LAYOUT_TYPES: u32 = 64;
    pub const LAYOUT_BLKSIZE: u32 = 65;
    pub const LAYOUT_ALIGNMENT: u32 = 66;
    pub const FS_LOCATIONS_INFO: u32 = 67;
    pub const MDSTHRESHOLD: u32 = 68;
    pub const RETENTION_GET: u32 = 69;
    pub const RETENTION_SET: u32 = 70;
    pub const RETENTEVT_GET: u32 = 71;
    pub const RETENTEVT_SET: u32 = 72;
    pub const RETENTION_HOLD: u32 = 73;
    pub const MODE_SET_MASKED: u32 = 74;
    pub const SUPPATTR_EXCLCREAT: u32 = 75;
    pub const FS_CHARSET_CAP: u32 = 76;
    pub const CLONE_BLKSIZE: u32 = 77;
    pub const SPACE_FREED: u32 = 78;
    pub const CHANGE_ATTR_TYPE: u32 = 79;
    pub const SEC_LABEL: u32 = 80;
}

/// `nfs_ftype4` (RFC 8881 §3.3.3 — called `nfs_ftype4` in the XDR).
pub mod ftype {
    pub const NF4REG: u32 = 1;
    pub const NF4DIR: u32 = 2;
    pub const NF4BLK: u32 = 3;
    pub const NF4CHR: u32 = 4;
    pub const NF4LNK: u32 = 5;
    pub const NF4SOCK: u32 = 6;
    pub const NF4FIFO: u32 = 7;
    pub const NF4ATTRDIR: u32 = 8;
    pub const NF4NAMEDATTR: u32 = 9;
}

/// ACCESS bits (RFC 8881 §18.1).
pub mod access {
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
    pub const ALL: u32 = 0x3f;
}

/// OPEN share access and deny bits (RFC 8881 §18.16).
pub mod share {
    pub const ACCESS_READ: u32 = 0x1;
    pub const ACCESS_WRITE: u32 = 0x2;
    pub const ACCESS_BOTH: u32 = 0x3;
    pub const DENY_NONE: u32 = 0x0;
    pub const DENY_READ: u32 = 0x1;
    pub const DENY_WRITE: u32 = 0x2;
    pub const DENY_BOTH: u32 = 0x3;
    /// The delegation-wish bits a 4.1 client may set in `share_access`.
    pub const WANT_DELEG_MASK: u32 = 0xff00;
    pub const WANT_SIGNAL_DELEG_WHEN_RESRC_AVAIL: u32 = 0x10000;
    pub const WANT_PUSH_DELEG_WHEN_UNCONTENDED: u32 = 0x20000;
}

/// OPEN result flags (RFC 8881 §18.16.3).
pub mod open_result {
    pub const CONFIRM: u32 = 0x2;
    pub const LOCKTYPE_POSIX: u32 = 0x4;
    pub const PRESERVE_UNLINKED: u32 = 0x8;
    pub const MAY_NOTIFY_LOCK: u32 = 0x20;
}

/// EXCHANGE_ID flags (RFC 8881 §18.35).
pub mod exchgid {
    pub const SUPP_MOVED_REFER: u32 = 0x1;
    pub const SUPP_MOVED_MIGR: u32 = 0x2;
    pub const SUPP_FENCE_OPS: u32 = 0x4;
    pub const BIND_PRINC_STATEID: u32 = 0x100;
    pub const USE_NON_PNFS: u32 = 0x1_0000;
    pub const USE_PNFS_MDS: u32 = 0x2_0000;
    pub const USE_PNFS_DS: u32 = 0x4_0000;
    pub const MASK_PNFS: u32 = 0x7_0000;
    pub const UPD_CONFIRMED_REC_A: u32 = 0x4000_0000;
    pub const CONFIRMED_R: u32 = 0x8000_0000;
    /// Every flag a client may send (RFC 8881 §18.35.3: others are NFS4ERR_INVAL).
    pub const CLIENT_MASK: u32 =
        SUPP_MOVED_REFER | SUPP_MOVED_MIGR | BIND_PRINC_STATEID | MASK_PNFS | UPD_CONFIRMED_REC_A;
}

/// CREATE_SESSION flags (RFC 8881 §18.36).
pub mod session_flags {
    pub const PERSIST: u32 = 0x1;
    pub const CONN_BACK_CHAN: u32 = 0x2;
    pub const CONN_RDMA: u32 = 0x4;
    /// Every flag RFC 8881 defines for csa_flags.
    pub const MASK: u32 = PERSIST | CONN_BACK_CHAN | CONN_RDMA;
}

/// SEQUENCE status flags (RFC 8881 §18.46.3).
pub mod seq4_status {
    pub const CB_PATH_DOWN: u32 = 0x1;
    pub const EXPIRED_ALL_STATE_REVOKED: u32 = 0x8;
    pub const EXPIRED_SOME_STATE_REVOKED: u32 = 0x10;
    pub const ADMIN_STATE_REVOKED: u32 = 0x20;
    pub const RECALLABLE_STATE_REVOKED: u32 = 0x40;
    pub const LEASE_MOVED: u32 = 0x80;
    pub const RESTART_RECLAIM_NEEDED: u32 = 0x100;
    pub const CB_PATH_DOWN_SESSION: u32 = 0x200;
    pub const BACKCHANNEL_FAULT: u32 = 0x400;
}

/// `channel_dir_from_client4` / `channel_dir_from_server4` (RFC 8881 §18.34).
pub mod cdfc {
    pub const FORE: u32 = 0x1;
    pub const BACK: u32 = 0x2;
    pub const FORE_OR_BOTH: u32 = 0x3;
    pub const BACK_OR_BOTH: u32 = 0x7;
    /// Server side: both directions.
    pub const SERVER_BOTH: u32 = 0x3;
}

/// `stable_how4` (RFC 8881 §18.32).
pub mod stable {
    pub const UNSTABLE4: u32 = 0;
    pub const DATA_SYNC4: u32 = 1;
    pub const FILE_SYNC4: u32 = 2;
}

/// `nfs_lock_type4` (RFC 8881 §18.10).
pub mod lock_type {
    pub const READ_LT: u32 = 1;
    pub const WRITE_LT: u32 = 2;
    pub const READW_LT: u32 = 3;
    pub const WRITEW_LT: u32 = 4;
}

/// `createmode4` (RFC 8881 §18.16).
pub mod createmode {
    pub const UNCHECKED4: u32 = 0;
    pub const GUARDED4: u32 = 1;
    pub const EXCLUSIVE4: u32 = 2;
    pub const EXCLUSIVE4_1: u32 = 3;
}

/// `open_claim_type4` (RFC 8881 §18.16).
pub mod claim {
    pub const NULL: u32 = 0;
    pub const PREVIOUS: u32 = 1;
    pub const DELEGATE_CUR: u32 = 2;
    pub const DELEGATE_PREV: u32 = 3;
    pub const FH: u32 = 4;
    pub const DELEG_CUR_FH: u32 = 5;
    pub const DELEG_PREV_FH: u32 = 6;
}

/// `open_delegation_type4` and `why_no_delegation4` (RFC 8881 §18.16).
pub mod deleg {
    pub const NONE: u32 = 0;
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const NONE_EXT: u32 = 3;
    pub const WND4_NOT_WANTED: u32 = 0;
    pub const WND4_CONTENTION: u32 = 1;
    pub const WND4_RESOURCE: u32 = 2;
}

/// `data_content4` (RFC 7862 §15.11, SEEK).
pub mod content {
    pub const DATA: u32 = 0;
    pub const HOLE: u32 = 1;
}

/// `FH4_*` expiry types (RFC 8881 §4.2.1): our handles are persistent.
pub const FH4_PERSISTENT: u32 = 0;

/// Fixed sizes (RFC 8881 §2.2).
pub const NFS4_FHSIZE: u32 = 128;
pub const NFS4_VERIFIER_SIZE: usize = 8;
pub const NFS4_OTHER_SIZE: usize = 12;
pub const NFS4_OPAQUE_LIMIT: u32 = 1024;
pub const NFS4_SESSIONID_SIZE: usize = 16;

/// Security flavors SECINFO can name (RFC 5531 §8.2).
pub const AUTH_NONE: u32 = 0;
pub const AUTH_SYS: u32 = 1;
pub const RPCSEC_GSS: u32 = 6;
